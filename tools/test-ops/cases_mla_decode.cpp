// cases_mla_decode.cpp: test-ops cases for absorbed MLA decode over the paged latent cache
// (ops/mla_decode.h).
//
// ref  = mla_decode_ref (fp64, reads the pages through the block table).
// cpu  = attention.h's attention_cpu on each sequence's rows gathered into one fp32 [n_ctx, 576] buffer
//        (the MQA latent layout: k = the whole row, v = its first 512 values, head strides 0).
// cuda = mla_decode_cuda (the default dispatch: every case here reads < 16K cache rows, so the mma.sync
//        kernel; softmax weights in bf16, so a looser bound) for op "mla_decode",
//        mla_decode_cuda_wgmma (sm_90a warpgroup MMA, heads as M) for "mla_decode_wgmma",
//        mla_decode_cuda_wgmma_hn (sm_90a warpgroup MMA, heads as N) for "mla_decode_wgmma_hn",
//        mla_decode_cuda_simple (CUDA cores) for "mla_decode_simple".
// Odd context lengths (1, 17, 989, 4097), several sequences of different lengths in one call, pages
// shuffled in the pool, unused block-table slots set to -1 (never read), head counts that are not a
// multiple of the kernels' head groups, forced split counts.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "core/dtype.h"
#include "harness.h"
#include "ops/attention.h"
#include "ops/mla_decode.h"

namespace k3::opt {
namespace {

struct MlaState {
  int H = 0, P = 0, n_split = 0, max_pages = 0, max_ctx = 0;
  float scale = 0;
  std::vector<int32_t> lens, table;
  int64_t n_pages = 0;
  std::vector<uint16_t> cache, q;
};

enum class Kind { mma, wgmma, wgmma_hn, simple };

void add_case(CaseList& cases, Kind kind, int H, int P, std::vector<int32_t> lens, float scale, int n_split) {
  auto st = std::make_shared<MlaState>();
  st->H = H, st->P = P, st->lens = lens, st->scale = scale, st->n_split = n_split;
  std::string shape = "H=" + std::to_string(H) + " P=" + std::to_string(P) + " lens=";
  for (size_t i = 0; i < lens.size(); ++i) shape += (i ? "," : "") + std::to_string(lens[i]);
  shape += " scale=" + std::to_string(scale).substr(0, 5) + " splits=" + std::to_string(n_split);
  cases.push_back(std::make_unique<FnCase>(
      kind == Kind::simple     ? "mla_decode_simple"
      : kind == Kind::wgmma    ? "mla_decode_wgmma"
      : kind == Kind::wgmma_hn ? "mla_decode_wgmma_hn"
                               : "mla_decode",
      shape, kind == Kind::simple ? 1e-9 : 1e-5,
      [st](Rng& rng) {
        const int n_seq = int(st->lens.size());
        st->max_ctx = *std::max_element(st->lens.begin(), st->lens.end());
        st->max_pages = (st->max_ctx + st->P - 1) / st->P + 1;
        int64_t used = 0;
        for (int32_t l : st->lens) used += (l + st->P - 1) / st->P;
        st->n_pages = used + 3;  // spare pages nobody owns
        std::vector<int32_t> perm(size_t(st->n_pages));
        std::iota(perm.begin(), perm.end(), 0);
        for (size_t i = perm.size() - 1; i > 0; --i)
          std::swap(perm[i], perm[size_t(rng.below(int64_t(i) + 1))]);
        st->table.assign(size_t(n_seq) * st->max_pages, -1);
        size_t next = 0;
        for (int b = 0; b < n_seq; ++b)
          for (int j = 0; j < (st->lens[size_t(b)] + st->P - 1) / st->P; ++j)
            st->table[size_t(b) * st->max_pages + size_t(j)] = perm[next++];
        std::vector<float> x(size_t(st->n_pages) * st->P * kMlaRow);
        fill_normal(rng, x.data(), int64_t(x.size()));
        st->cache.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) st->cache[i] = f32_to_bf16(x[i]);
        x.resize(size_t(n_seq) * st->H * kMlaRow);
        fill_normal(rng, x.data(), int64_t(x.size()));
        st->q.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) st->q[i] = f32_to_bf16(x[i]);
      },
      [st, kind](Backend b, RunContext& ctx) {
        const int n_seq = int(st->lens.size());
        float* out = ctx.out_f32(0, int64_t(n_seq) * st->H * kMlaLatent);
        MlaDecodeParams p;
        p.n_seq = n_seq, p.n_head = st->H, p.page_size = st->P, p.max_pages = st->max_pages;
        p.n_pages = st->n_pages, p.max_ctx = st->max_ctx, p.scale = st->scale, p.n_split = st->n_split;
        p.ctx_len = st->lens.data(), p.block_table = st->table.data(), p.cache = st->cache.data();
        p.q = st->q.data(), p.out = out;
        K3_ASSERT(mla_decode_check(p).ok());
        if (b == Backend::ref) {
          mla_decode_ref(p);
        } else if (b == Backend::cpu) {
          for (int s = 0; s < n_seq; ++s) {
            const int n = st->lens[size_t(s)];
            std::vector<float> rows(size_t(n) * kMlaRow), q(size_t(st->H) * kMlaRow);
            for (int t = 0; t < n; ++t) {
              const int32_t page = st->table[size_t(s) * st->max_pages + size_t(t / st->P)];
              const uint16_t* r = &st->cache[(size_t(page) * st->P + size_t(t % st->P)) * kMlaRow];
              for (int i = 0; i < kMlaRow; ++i) rows[size_t(t) * kMlaRow + i] = bf16_to_f32(r[i]);
            }
            for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(st->q[size_t(s) * q.size() + i]);
            AttentionParams a;
            a.n_q = 1, a.n_kv = n, a.n_head = st->H, a.d_qk = kMlaRow, a.d_v = kMlaLatent;
            a.q = q.data(), a.q_tok_stride = int64_t(st->H) * kMlaRow, a.q_head_stride = kMlaRow;
            a.k = rows.data(), a.k_tok_stride = kMlaRow, a.k_head_stride = 0;
            a.v = rows.data(), a.v_tok_stride = kMlaRow, a.v_head_stride = 0;
            a.q_pos0 = n - 1, a.scale = st->scale;
            a.out = out + size_t(s) * st->H * kMlaLatent;
            attention_cpu(a, ctx.pool);
          }
        } else {
#ifdef K3_HAVE_CUDA
          p.ctx_len = ctx.dev_in(st->lens), p.block_table = ctx.dev_in(st->table);
          p.cache = ctx.dev_in(st->cache), p.q = ctx.dev_in(st->q);
          p.out = ctx.dev_out_f32(0, int64_t(n_seq) * st->H * kMlaLatent);
          ctx.gpu_run([&] {
            if (kind == Kind::simple)
              mla_decode_cuda_simple(p, *ctx.gpu);
            else if (kind == Kind::wgmma)
              mla_decode_cuda_wgmma(p, *ctx.gpu);
            else if (kind == Kind::wgmma_hn)
              mla_decode_cuda_wgmma_hn(p, *ctx.gpu);
            else
              mla_decode_cuda(p, *ctx.gpu);
          });
#endif
        }
      },
      false, 0, 0, kCudaBuilt));
}

}  // namespace

K3_OP_CASES(mla_decode_cases) {
  const float s192 = 1.f / std::sqrt(192.f);  // 1 / sqrt(qk_nope + qk_rope)
  for (Kind kind : {Kind::mma, Kind::wgmma, Kind::wgmma_hn, Kind::simple}) {
    add_case(cases, kind, 96, 64, {1, 17, 300}, s192, 0);
    add_case(cases, kind, 20, 16, {989, 4097, 64}, s192, 0);
    add_case(cases, kind, 16, 64, {4097}, 0.3f, 3);    // peaky softmax, uneven forced splits
    add_case(cases, kind, 40, 32, {1, 989}, s192, 1);  // one split: no combine across splits
    add_case(cases, kind, 8, 64, {1}, s192, 0);
  }
  add_case(cases, Kind::wgmma, 128, 7, {65, 2000, 129, 3}, s192, 0);  // two full head groups, odd page size
  add_case(cases, Kind::wgmma, 96, 64, {8191}, s192, 2);              // 2 splits of 4096: 64 tiles each
  add_case(cases, Kind::wgmma_hn, 128, 7, {65, 2000, 129, 3}, s192, 0);  // 48 + 48 + 32 heads, odd pages
  add_case(cases, Kind::wgmma_hn, 96, 64, {8191}, s192, 2);
  add_case(cases, Kind::wgmma_hn, 96, 1, {130, 2048}, s192, 0);  // pages of one row (mla_sparse's view)
}

}  // namespace k3::opt
