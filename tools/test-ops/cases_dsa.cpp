// cases_dsa.cpp: test-ops cases for the DSA ops: index-key store, index scores, causal top-k (ops/dsa_*.h).
//
// ref = the plain references (fp64 scores; partial_sort top-k); cpu = the same references (the CPU model
// keeps its own indexer in model/dsa.cpp); cuda = the kernels. Shapes: K3.1's 32 x 128 indexer and the
// tiny-k31 2 x 16 one (tensor cores), an odd 16 x 64 one (the CUDA-core fallback); decode batches with odd
// lengths (1, 77, 2049, 3001) over shuffled pages, prefill rows with a causal edge, FP8 keys. Sparse MLA:
// cases_dsa_sparse.cpp.
// Top-k: exact equality of the selected sets with many ties (few distinct values, +0 / -0 mixed, whole rows
// equal), rows at and around topk, forced cluster sizes, a 1M-long row, and the sample kernel
// (DsaTopkKernel::sample) on each law, and rows whose largest scores crowd at the end.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/dtype.h"
#include "harness.h"
#include "ops/dsa_index.h"
#include "ops/dsa_topk.h"

namespace k3::opt {
namespace {

// ---- top-k ----
enum class Law { normal, few_levels, signed_zeros, all_equal, rising };

struct TopkState {
  int topk = 0, cluster = 0;
  DsaTopkKernel kernel = DsaTopkKernel::automatic;
  std::vector<int32_t> lens;  // decode rows; empty: prefill rows len0 + i
  int64_t len0 = 0;
  int n_prefill = 0;
  Law law = Law::normal;
  int64_t ld = 0, max_len = 0;
  std::vector<float> score;
};

const char* law_name(Law l) {
  return l == Law::normal         ? "normal"
         : l == Law::few_levels   ? "4-levels"
         : l == Law::signed_zeros ? "+-0"
         : l == Law::all_equal    ? "equal"
                                  : "rising";
}

void add_topk(CaseList& cases, int topk, std::vector<int32_t> lens, int64_t len0, int n_prefill, Law law,
              int cluster = 0, DsaTopkKernel kernel = DsaTopkKernel::automatic) {
  auto st = std::make_shared<TopkState>();
  st->topk = topk, st->lens = lens, st->len0 = len0, st->n_prefill = n_prefill, st->law = law;
  st->cluster = cluster, st->kernel = kernel;
  std::string shape = "topk=" + std::to_string(topk) + " ";
  if (lens.empty()) {
    shape += "prefill len0=" + std::to_string(len0) + " rows=" + std::to_string(n_prefill);
  } else {
    shape += "lens=";
    for (size_t i = 0; i < lens.size(); ++i) shape += (i ? "," : "") + std::to_string(lens[i]);
  }
  shape += std::string(" law=") + law_name(law) + " cluster=" + std::to_string(cluster);
  if (kernel == DsaTopkKernel::sample) shape += " sample";
  cases.push_back(std::make_unique<FnCase>(
      "dsa_topk", shape, 0.0,
      [st](Rng& rng) {
        const int n_row = st->lens.empty() ? st->n_prefill : int(st->lens.size());
        st->max_len =
            st->lens.empty() ? st->len0 + n_row - 1 : *std::max_element(st->lens.begin(), st->lens.end());
        st->ld = st->max_len + 3;
        st->score.resize(size_t(n_row) * st->ld);
        for (size_t i = 0; i < st->score.size(); ++i) {
          float& v = st->score[i];
          switch (st->law) {
            case Law::normal:
              v = rng.normal();
              break;
            case Law::few_levels:
              v = float(rng.below(4)) - 1.f;
              break;
            case Law::signed_zeros:
              v = rng.below(3) == 0 ? 0.5f : (rng.below(2) ? 0.f : -0.f);
              break;
            case Law::all_equal:
              v = 1.25f;
              break;
            case Law::rising:  // the largest scores crowd at the end of the row (the last CTAs' chunks)
              v = float(i % size_t(st->ld)) * 1e-3f + 0.1f * rng.normal();
              break;
          }
        }
      },
      [st](Backend b, RunContext& ctx) {
        const int n_row = st->lens.empty() ? st->n_prefill : int(st->lens.size());
        DsaTopkParams p;
        p.n_row = n_row, p.topk = st->topk, p.ld = st->ld, p.score = st->score.data();
        p.row_len = st->lens.empty() ? nullptr : st->lens.data();
        p.len0 = st->len0, p.max_len = st->max_len, p.cluster = st->cluster, p.kernel = st->kernel;
        p.sel = ctx.out_i32(0, int64_t(n_row) * st->topk);
        K3_ASSERT(dsa_topk_check(p).ok());
        if (b != Backend::cuda) {
          dsa_topk_ref(p);
        } else {
#ifdef K3_HAVE_CUDA
          p.score = ctx.dev_in(st->score);
          if (p.row_len) p.row_len = ctx.dev_in(st->lens);
          p.sel = ctx.dev_out_i32(0, int64_t(n_row) * st->topk);
          ctx.gpu_run([&] { dsa_topk_cuda(p, *ctx.gpu); });
#endif
        }
      },
      false, 0, 0, kCudaBuilt));
}

// ---- index keys and scores ----
struct IndexState {
  DsaKeyFormat fmt = DsaKeyFormat::bf16;
  int H = 0, Di = 0, P = 0, max_pages = 0;
  bool exact = false;
  std::vector<int32_t> lens;  // decode; empty: prefill n_q queries after n_past
  int64_t n_past = 0;
  int n_q = 0, n_seq = 0;
  int64_t n_pages = 0, max_ctx = 0, ld = 0;
  std::vector<int32_t> table;
  std::vector<uint8_t> pages;  // stored keys (by the reference store)
  std::vector<float> keys, q, w;
  std::vector<int32_t> tok_seq, tok_pos;  // store rows: every cached token
};

void init_index(IndexState& st, Rng& rng) {
  st.n_seq = st.lens.empty() ? 1 : int(st.lens.size());
  std::vector<int64_t> n_tok(size_t(st.n_seq));
  for (int b = 0; b < st.n_seq; ++b)
    n_tok[size_t(b)] = st.lens.empty() ? st.n_past + st.n_q : st.lens[size_t(b)];
  st.max_ctx = *std::max_element(n_tok.begin(), n_tok.end());
  st.ld = st.max_ctx + 5;
  st.max_pages = int((st.max_ctx + st.P - 1) / st.P) + 1;
  int64_t used = 0;
  for (int64_t n : n_tok) used += (n + st.P - 1) / st.P;
  st.n_pages = used + 2;
  std::vector<int32_t> perm(size_t(st.n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[size_t(rng.below(int64_t(i) + 1))]);
  st.table.assign(size_t(st.n_seq) * st.max_pages, -1);
  size_t next = 0;
  for (int b = 0; b < st.n_seq; ++b)
    for (int64_t j = 0; j < (n_tok[size_t(b)] + st.P - 1) / st.P; ++j)
      st.table[size_t(b) * st.max_pages + size_t(j)] = perm[next++];
  st.tok_seq.clear(), st.tok_pos.clear();
  for (int b = 0; b < st.n_seq; ++b)
    for (int64_t s = 0; s < n_tok[size_t(b)]; ++s) st.tok_seq.push_back(b), st.tok_pos.push_back(int32_t(s));
  // keys like the model's: LayerNorm output (zero mean, unit variance per row) rounded to bf16
  st.keys.resize(st.tok_seq.size() * st.Di);
  fill_uniform_bf16(rng, st.keys.data(), int64_t(st.keys.size()), -1.7f, 1.7f);
  const int n_q = st.lens.empty() ? st.n_q : st.n_seq;
  st.q.resize(size_t(n_q) * st.H * st.Di);
  fill_normal(rng, st.q.data(), int64_t(st.q.size()), 0.3f);
  st.w.resize(size_t(n_q) * st.H);
  fill_normal(rng, st.w.data(), int64_t(st.w.size()), 1.0f);
  st.pages.assign(size_t(st.n_pages) * dsa_key_page_bytes(st.fmt, st.P, st.Di), 0);
}

DsaKeyCache host_cache(IndexState& st) {
  DsaKeyCache c;
  c.fmt = st.fmt, c.d_head = st.Di, c.page_size = st.P, c.max_pages = st.max_pages, c.n_pages = st.n_pages;
  c.pages = st.pages.data(), c.block_table = st.table.data();
  return c;
}

std::string index_shape(const IndexState& st) {
  std::string s = "H=" + std::to_string(st.H) + " Di=" + std::to_string(st.Di) +
                  " P=" + std::to_string(st.P) + (st.fmt == DsaKeyFormat::fp8 ? " fp8" : " bf16") +
                  (st.exact ? " q_exact" : "") + " ";
  if (st.lens.empty())
    return s + "prefill n_past=" + std::to_string(st.n_past) + " n_q=" + std::to_string(st.n_q);
  s += "lens=";
  for (size_t i = 0; i < st.lens.size(); ++i) s += (i ? "," : "") + std::to_string(st.lens[i]);
  return s;
}

void add_index(CaseList& cases, DsaKeyFormat fmt, int H, int Di, int P, bool exact, std::vector<int32_t> lens,
               int64_t n_past = 0, int n_q = 0) {
  auto st = std::make_shared<IndexState>();
  st->fmt = fmt, st->H = H, st->Di = Di, st->P = P, st->exact = exact, st->lens = lens, st->n_past = n_past;
  st->n_q = n_q;
  // bf16 q: fp32 mma sums vs fp64; exact q: the hi + lo split leaves ~2^-16; fp8: f16 q (2^-11)
  const double bound = fmt == DsaKeyFormat::fp8 ? 1e-6 : exact ? 1e-8 : 1e-9;
  cases.push_back(std::make_unique<FnCase>(
      "dsa_index", index_shape(*st), bound,
      [st](Rng& rng) {
        init_index(*st, rng);
        DsaKeyStoreParams s;
        s.cache = host_cache(*st), s.n_tok = int(st->tok_seq.size()), s.k = st->keys.data();
        s.seq = st->tok_seq.data(), s.pos = st->tok_pos.data();
        dsa_key_store_ref(s);
      },
      [st](Backend b, RunContext& ctx) {
        const int n_q = st->lens.empty() ? st->n_q : st->n_seq;
        DsaIndexParams p;
        p.cache = host_cache(*st), p.n_head = st->H, p.n_q = n_q;
        p.ctx_len = st->lens.empty() ? nullptr : st->lens.data();
        p.n_past = st->n_past, p.max_ctx = st->max_ctx, p.q = st->q.data(), p.w = st->w.data();
        p.scale = 1.f / std::sqrt(float(st->H * st->Di)), p.q_exact = st->exact, p.ld = st->ld;
        p.score = ctx.out_f32(0, int64_t(n_q) * st->ld);
        K3_ASSERT(dsa_index_check(p).ok());
        if (b != Backend::cuda) {
          dsa_index_ref(p);
        } else {
#ifdef K3_HAVE_CUDA
          p.cache.pages = const_cast<uint8_t*>(ctx.dev_in(st->pages));
          p.cache.block_table = ctx.dev_in(st->table);
          if (p.ctx_len) p.ctx_len = ctx.dev_in(st->lens);
          p.q = ctx.dev_in(st->q), p.w = ctx.dev_in(st->w);
          p.score = ctx.dev_out_f32(0, int64_t(n_q) * st->ld);
          ctx.gpu_run([&] { dsa_index_cuda(p, *ctx.gpu); });
#endif
        }
      },
      false, 0, 0, kCudaBuilt));
}

// The store itself: the whole page pool as int32 words must be bit-identical (fp8: the same e4m3 rounding).
void add_store(CaseList& cases, DsaKeyFormat fmt, int Di, int P, std::vector<int32_t> lens) {
  auto st = std::make_shared<IndexState>();
  st->fmt = fmt, st->H = 1, st->Di = Di, st->P = P, st->lens = lens;
  cases.push_back(std::make_unique<FnCase>(
      "dsa_key_store", index_shape(*st), 0.0,
      [st](Rng& rng) {
        init_index(*st, rng);
        // exercise e4m3 edge values: zeros, a zero row, tiny and huge entries
        if (!st->keys.empty()) {
          for (int e = 0; e < st->Di; ++e) st->keys[size_t(e)] = 0.f;
          for (size_t i = st->Di; i < st->keys.size(); i += 37) st->keys[i] *= (i % 3 == 0) ? 1e-6f : 300.f;
        }
      },
      [st](Backend b, RunContext& ctx) {
        const int64_t words = int64_t(st->pages.size() / 4);
        DsaKeyStoreParams s;
        s.cache = host_cache(*st), s.n_tok = int(st->tok_seq.size()), s.k = st->keys.data();
        s.seq = st->tok_seq.data(), s.pos = st->tok_pos.data();
        int32_t* out = ctx.out_i32(0, words);
        std::memset(out, 0, size_t(words) * 4);
        s.cache.pages = out;
        if (b != Backend::cuda) {
          dsa_key_store_ref(s);
        } else {
#ifdef K3_HAVE_CUDA
          s.cache.pages = ctx.dev_out_i32(0, words);
          s.cache.block_table = ctx.dev_in(st->table);
          s.k = ctx.dev_in(st->keys), s.seq = ctx.dev_in(st->tok_seq), s.pos = ctx.dev_in(st->tok_pos);
          ctx.gpu_run([&] { dsa_key_store_cuda(s, *ctx.gpu); });
#endif
        }
      },
      false, 0, 0, kCudaBuilt));
}

}  // namespace

K3_OP_CASES(dsa_cases) {
  // store
  add_store(cases, DsaKeyFormat::bf16, 128, 64, {1, 77, 130});
  add_store(cases, DsaKeyFormat::fp8, 128, 64, {1, 77, 130});
  add_store(cases, DsaKeyFormat::fp8, 16, 16, {45});
  // scores: K3.1 shapes (tensor cores), decode and prefill, bf16 / exact / fp8
  for (DsaKeyFormat f : {DsaKeyFormat::bf16, DsaKeyFormat::fp8}) {
    add_index(cases, f, 32, 128, 64, false, {1, 77, 3001});
    add_index(cases, f, 32, 128, 16, false, {}, 100, 37);
    add_index(cases, f, 27, 128, 64, false, {2049});       // heads padded to the tile
    add_index(cases, f, 32, 128, 128, false, {4100, 65});  // two key tiles a page
  }
  add_index(cases, DsaKeyFormat::bf16, 32, 128, 64, true, {1, 77, 3001});
  add_index(cases, DsaKeyFormat::bf16, 32, 128, 64, true, {}, 0, 130);
  add_index(cases, DsaKeyFormat::bf16, 2, 16, 16, false, {}, 9, 23);  // tiny-k31 (tensor cores)
  add_index(cases, DsaKeyFormat::bf16, 2, 16, 16, false, {30, 5});
  add_index(cases, DsaKeyFormat::bf16, 2, 16, 16, true, {30, 5});     // CUDA-core fallback
  add_index(cases, DsaKeyFormat::bf16, 16, 64, 32, false, {1, 500});  // CUDA-core fallback
  add_index(cases, DsaKeyFormat::fp8, 16, 64, 32, false, {}, 3, 40);
  // top-k: decode rows around topk, ties, prefill rows, clusters, a 1M row
  add_topk(cases, 2048, {1, 2047, 2048, 2049, 5000, 70001}, 0, 0, Law::normal);
  add_topk(cases, 2048, {4097, 9000, 40000}, 0, 0, Law::few_levels);
  add_topk(cases, 2048, {6000, 2049, 131072}, 0, 0, Law::signed_zeros);
  add_topk(cases, 2048, {3000, 50000}, 0, 0, Law::all_equal);
  add_topk(cases, 2048, {}, 2040, 21, Law::few_levels);
  add_topk(cases, 2048, {100000}, 0, 0, Law::few_levels, 3);
  add_topk(cases, 2048, {100000, 33}, 0, 0, Law::normal, 8);
  add_topk(cases, 2048, {131072, 70001, 8192}, 0, 0, Law::normal, 16);  // staged chunks of <= 8192
  add_topk(cases, 2048, {8192, 5000}, 0, 0, Law::normal, 4);            // K3_DSA_TOPK_FILL's b1 x 8K count
  add_topk(cases, 2048, {8192, 3000, 2049}, 0, 0, Law::few_levels, 2);  // and its b64 x 8K one
  add_topk(cases, 2048, {131072, 2100}, 0, 0, Law::few_levels);
  add_topk(cases, 8, {}, 1, 40, Law::few_levels);  // tiny-k31 topk
  add_topk(cases, 2048, {1 << 20}, 0, 0, Law::few_levels);
  add_topk(cases, 2048, {1 << 20}, 0, 0, Law::normal);
  // the sample kernel: staged rows (<= 8192), candidate rows, the whole-row fallback (many equal scores)
  constexpr DsaTopkKernel kSample = DsaTopkKernel::sample;
  add_topk(cases, 2048, {1, 2047, 2048, 2049, 5000, 8192, 8193, 70001}, 0, 0, Law::normal, 0, kSample);
  add_topk(cases, 2048, {131072, 9000, 40000}, 0, 0, Law::normal, 0, kSample);
  add_topk(cases, 2048, {4097, 9000, 40000}, 0, 0, Law::few_levels, 0, kSample);
  add_topk(cases, 2048, {6000, 2049, 131072}, 0, 0, Law::signed_zeros, 0, kSample);
  add_topk(cases, 2048, {3000, 50000}, 0, 0, Law::all_equal, 0, kSample);
  add_topk(cases, 2048, {}, 9000, 21, Law::normal, 0, kSample);
  add_topk(cases, 8, {}, 1, 40, Law::few_levels, 0, kSample);
  add_topk(cases, 100, {20000, 300000}, 0, 0, Law::normal, 0, kSample);
  add_topk(cases, 2048, {1 << 20}, 0, 0, Law::normal, 0, kSample);
  add_topk(cases, 2048, {70001, 131072}, 0, 0, Law::rising, 0, kSample);
  add_topk(cases, 2048, {131072, 70001, 17000}, 0, 0, Law::rising, 16);  // the top crowd in the last chunk
  add_topk(cases, 2048, {65536, 33000}, 0, 0, Law::rising, 8);
}

}  // namespace k3::opt
