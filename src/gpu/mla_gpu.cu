// mla_gpu.cu: gated MLA / DSA attention on the GPU (model/mla.cpp, MODEL.md §5-6).
//
//   q = q_b_proj RMSNorm(q_a_proj x) (K3) | q_proj x (KL);  [c~ | r] = kv_a_proj_with_mqa x;  c = RMSNorm(c~)
//   cache row [c | r] (d_latent) appended to the sequence's latent cache
//   unabsorbed (prefill): [k_nope_h | v_h] = kv_b_proj c_s for every cached row, k_h = [k_nope_h | r_s]
//   absorbed (decode):    q^_h = [W_UK_h^T q_nope_h | q_r_h], MQA over the 576-wide cache, z_h = W_UV_h z^_h
//   z *= sigmoid(g_proj x) (output gate);  out = o_proj z.   S_t: causal, or the DSA selection (dsa_gpu.cu)
// W_UK / W_UV are read from kv_b_proj itself when it is bf16, else from an fp32 copy of it (exact), with fp32
// sums, as the CPU does.
//
// Default in bf16 mode since session 4 (K3_MLA_FAST=0 in the environment: the generic kernels) with the
// production head dims (kv_lora_rank 512, rope 64; nope 128, v 128), dense causal: the tensor-core kernels on
// bf16 copies of their inputs (all bf16-exact in this mode, q^ included: docs/decisions.md gpu.1; the
// kernels also round the softmax weights to bf16):
//   absorbed:   mla_decode_cuda over the latent rows' bf16 pages (cache_pool_gpu.cuh: the model's pool,
//               appended at every call); a decode call (every row absorbed) is one launch for the whole
//               batch, a block-table row per query row;
//   unabsorbed: mla_prefill_cuda on q, kv_b_proj's [k_nope | v] rows and the latent's rope part.
// fp32 mode, other dims and K3_MLA_FAST=0: the exact generic attention_cuda; DSA-sparse calls: attention_cuda
// with the selection (absorbed ones on ops/mla_sparse.h unless K3_DSA_SPARSE_MLA=0; a decode call selects
// and attends for the whole batch in one launch each, dsa_select_rows_gpu then sparse_rows).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "gpu/cache_pool_gpu.cuh"
#include "ops/attention.h"
#include "ops/mla_decode.h"
#include "ops/mla_prefill.h"
#include "ops/mla_sparse.h"

namespace k3::gpu {

namespace {

// K[s, h, :] = [kvb[s, h, :d_nope] | latent[s, R : R + d_rope]]
__global__ void build_k_kernel(float* K, const float* kvb, const float* latent, int64_t n_ctx, int nh, int dn,
                               int dr, int R, int dl, int wkv) {
  const int dqk = dn + dr;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_ctx * nh * dqk) return;
  const int64_t s = i / (int64_t(nh) * dqk);
  const int h = int((i / dqk) % nh), e = int(i % dqk);
  K[i] = e < dn ? kvb[s * nh * wkv + int64_t(h) * wkv + e] : latent[s * dl + R + (e - dn)];
}

// The rows of one call on the device (one pinned copy, call_rows): row r belongs to the k-th sequence with
// rows, k = row_seq[r], at position pos[r], and sees ctx[r] = pos[r] + 1 positions; table row k holds that
// sequence's page ids; lat[r] / idx[r] are the fp32 cache rows (latent, DSA index keys) it appends.
struct CallRows {
  DevBuf buf;
  const int32_t *table = nullptr, *row_seq = nullptr, *pos = nullptr, *ctx = nullptr;
  float* const* lat = nullptr;
  float* const* idx = nullptr;
  int max_pages = 0;
  int64_t max_ctx = 0;
  std::vector<int> live;  // index into seqs of the k-th sequence with rows
};

Status call_rows(const GpuCtx& c, std::span<const MlaSeqGpu> seqs, int64_t n_tok, int dl, int Di,
                 CallRows* cr) {
  int max_pages = 1;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MlaSeqGpu& s = seqs[i];
    if (s.n_tok <= 0) continue;
    cr->live.push_back(int(i));
    cr->max_ctx = std::max(cr->max_ctx, s.n_past + s.n_tok);
    if (s.st->table) max_pages = std::max(max_pages, int((s.n_past + s.n_tok + kCachePage - 1) / kCachePage));
  }
  const int64_t n_live = int64_t(cr->live.size());
  const size_t n_int = size_t(n_live * max_pages + 3 * n_tok), ptr_at = (n_int * 4 + 7) / 8 * 8;
  std::vector<uint8_t> h(ptr_at + size_t(2 * n_tok) * 8);
  int32_t* table = reinterpret_cast<int32_t*>(h.data());
  int32_t* row_seq = table + n_live * max_pages;
  int32_t *pos = row_seq + n_tok, *ctx = pos + n_tok;
  float** lat = reinterpret_cast<float**>(h.data() + ptr_at);
  float** idx = lat + n_tok;
  int64_t covered = 0;
  for (int64_t k = 0; k < n_live; ++k) {
    const MlaSeqGpu& s = seqs[size_t(cr->live[size_t(k)])];
    const std::vector<int32_t>* pages = s.st->table;
    // GpuSeqState::reserve ran before the layer loop: room for the new rows, and their pages
    K3_ASSERT(s.st->cap >= s.n_past + s.n_tok);
    K3_ASSERT(!pages || int64_t(pages->size()) * kCachePage >= s.n_past + s.n_tok);
    for (int j = 0; j < max_pages; ++j)  // padding: page 0, never read (positions < ctx only)
      table[k * max_pages + j] = pages && j < int(pages->size()) ? (*pages)[size_t(j)] : 0;
    for (int64_t t = 0; t < s.n_tok; ++t) {
      const int64_t r = s.row0 + t, at = s.n_past + t;
      row_seq[r] = int32_t(k), pos[r] = int32_t(at), ctx[r] = int32_t(at + 1);
      lat[r] = s.st->latent + at * dl;
      idx[r] = s.st->index_k ? s.st->index_k + at * Di : nullptr;
    }
    covered += s.n_tok;
  }
  K3_ASSERT(covered == n_tok);  // the sequences' rows tile the call's rows
  K3_RETURN_IF_ERROR(cr->buf.alloc_bytes(c, h.size()));
  K3_RETURN_IF_ERROR(to_device(c, cr->buf.as<void>(), h.data(), h.size()));
  const auto* d = cr->buf.as<uint8_t>();
  cr->table = reinterpret_cast<const int32_t*>(d);
  cr->row_seq = cr->table + n_live * max_pages;
  cr->pos = cr->row_seq + n_tok, cr->ctx = cr->pos + n_tok;
  cr->lat = reinterpret_cast<float* const*>(d + ptr_at);
  cr->idx = cr->lat + n_tok;
  cr->max_pages = max_pages;
  return ok_status();
}

// *dst[r] = src[r, :] for r < n_rows (the cache rows the call appends).
__global__ void append_rows_kernel(float* const* dst, const float* src, int64_t n_rows, int width) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_rows * width) dst[i / width][i % width] = src[i];
}

// out[r, :] = table[row_seq[r], :]: a block-table row per query row.
__global__ void row_tables_kernel(int32_t* out, const int32_t* table, const int32_t* row_seq, int64_t n_rows,
                                  int max_pages) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_rows * max_pages) out[i] = table[int64_t(row_seq[i / max_pages]) * max_pages + i % max_pages];
}

// The block table of query rows [r0, r0 + n) of the call: table rows of their sequences, one per row.
Status row_tables(const GpuCtx& c, const CallRows& cr, int64_t r0, int64_t n, DevBuf* out) {
  K3_RETURN_IF_ERROR(out->alloc_bytes(c, size_t(n * cr.max_pages) * 4));
  row_tables_kernel<<<blocks_for(n * cr.max_pages), kThreads, 0, c.stream()>>>(
      out->as<int32_t>(), cr.table, cr.row_seq + r0, n, cr.max_pages);
  return ok_status();
}

// *g = the context's GpuContext with a workspace of its own in ws, sized for mla_decode_cuda on d's shapes
// (the split-KV partials of the tensor-core decode kernels).
Status decode_context(const GpuCtx& c, const MlaDecodeParams& d, DevBuf* ws, GpuContext* g) {
  *g = *c.g;
  g->workspace_bytes = mla_decode_workspace_bytes(d, 0);
  K3_RETURN_IF_ERROR(ws->alloc_bytes(c, g->workspace_bytes));
  g->workspace = ws->f();
  return ok_status();
}

Status to_bf16(const GpuCtx& c, const float* x, int64_t n, DevBuf* y) {
  K3_RETURN_IF_ERROR(y->alloc_bytes(c, size_t(n) * 2));
  to_bf16_bits(c.stream(), x, n, y->as<uint16_t>());
  return ok_status();
}

// Absorbed attention of n query rows q16 [n, nh, 576] (bf16), row b over the first ctx[b] positions of the
// latent pages of its table row -> zs [n, nh, 512].
Status decode_rows(const GpuCtx& c, const uint16_t* q16, const PagedRows& lat, const int32_t* ctx,
                   int64_t max_ctx, int64_t n, int nh, float scale, float* zs) {
  DevBuf ws;
  MlaDecodeParams p;
  p.n_seq = int(n), p.n_head = nh, p.page_size = kCachePage, p.max_pages = lat.max_pages;
  p.n_pages = lat.n_pages, p.max_ctx = int(max_ctx), p.ctx_len = ctx, p.block_table = lat.table;
  p.cache = lat.pages, p.q = q16, p.scale = scale, p.out = zs;
  K3_RETURN_IF_ERROR(mla_decode_check(p));
  GpuContext g;
  K3_RETURN_IF_ERROR(decode_context(c, p, &ws, &g));
  mla_decode_cuda(p, g);
  return ok_status();
}

// Absorbed attention of n query rows over their DSA-selected positions (ops/mla_sparse.h): sel [n, topk]
// ascending (-1 padded); block table row b per query, or row 0 for all (shared). Flat in the context.
Status sparse_rows(const GpuCtx& c, const uint16_t* q16, const PagedRows& lat, bool shared,
                   const int32_t* sel, int64_t n, int nh, int64_t topk, float scale, float* zs) {
  DevBuf scratch, ws;
  MlaSparseParams p;
  p.n_q = int(n), p.n_head = nh, p.topk = int(topk), p.sel = sel;
  p.page_size = kCachePage, p.max_pages = lat.max_pages, p.n_pages = lat.n_pages, p.block_table = lat.table;
  p.shared_table = shared, p.cache = lat.pages, p.q = q16;
  p.scale = scale, p.out = zs;
  K3_RETURN_IF_ERROR(mla_sparse_check(p));
  K3_RETURN_IF_ERROR(scratch.alloc_bytes(c, mla_sparse_scratch_bytes(p.n_q, p.topk)));
  p.scratch = scratch.as<void>();
  MlaDecodeParams d;  // the decode call mla_sparse_cuda makes over the gathered rows, for its partials
  d.n_seq = p.n_q, d.n_head = nh, d.page_size = p.topk, d.max_pages = 1, d.n_pages = p.n_q;
  d.max_ctx = p.topk;
  GpuContext g;
  K3_RETURN_IF_ERROR(decode_context(c, d, &ws, &g));
  mla_sparse_cuda(p, g);
  return ok_status();
}

// Dense causal unabsorbed attention of one sequence: q [n_tok, nh, 192], kvb [n_ctx, nh, 256] = [k_nope | v],
// the rope keys at latent[:, 512:576] -> z [n_tok, nh, 128].
Status prefill_fast(const GpuCtx& c, const float* q, const float* kvb, const MlaStateGpu& st, int64_t n_tok,
                    int64_t n_past, int nh, int R, float scale, float* z) {
  const int64_t n_ctx = n_past + n_tok, dl = R + kMlaPrefillRope;
  DevBuf q16, kv16, lat16;
  K3_RETURN_IF_ERROR(to_bf16(c, q, n_tok * nh * kMlaPrefillQk, &q16));
  K3_RETURN_IF_ERROR(to_bf16(c, kvb, n_ctx * nh * 256, &kv16));
  K3_RETURN_IF_ERROR(
      to_bf16(c, st.latent, n_ctx * dl, &lat16));  // the rope keys (prefill reads the fp32 rows)
  const uint16_t* lat = lat16.as<uint16_t>();
  MlaPrefillParams p;
  p.n_q = int(n_tok), p.n_kv = int(n_ctx), p.n_head = nh, p.q_pos0 = int(n_past), p.scale = scale, p.out = z;
  p.q = q16.as<uint16_t>(), p.q_tok_stride = int64_t(nh) * kMlaPrefillQk, p.q_head_stride = kMlaPrefillQk;
  p.k_nope = kv16.as<uint16_t>(), p.k_tok_stride = int64_t(nh) * 256, p.k_head_stride = 256;
  p.v = kv16.as<uint16_t>() + kMlaPrefillNope, p.v_tok_stride = int64_t(nh) * 256, p.v_head_stride = 256;
  p.k_rope = lat + R, p.r_tok_stride = dl, p.r_head_stride = 0;
  K3_RETURN_IF_ERROR(mla_prefill_check(p));
  mla_prefill_cuda(p, *c.g);
  return ok_status();
}

// out = o_proj (z * sigmoid(g_proj x)) from the attention output z [n_tok, nh, dv] (rounded here).
Status finish(const GpuCtx& c, const ModelConfig& cfg, const MlaWeightsGpu& w, const float* x, int64_t n_tok,
              float* z, float* out, int layer) {
  const int64_t nz = n_tok * cfg.mla.n_head * cfg.mla.d_v;
  c.rnd(z, nz);
  c.cb("mla_z", layer, z, nz);
  if (cfg.mla.use_output_gate) {
    DevBuf g;
    K3_RETURN_IF_ERROR(g.alloc(c, nz));
    linear(c, w.g_proj, x, n_tok, g.f());
    sigmoid_mul_inplace(c, z, g.f(), nz);
    c.rnd(z, nz);
  }
  linear(c, w.o_proj, z, n_tok, out);
  return launch_status("mla layer");
}

}  // namespace

Status mla_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const MlaWeightsGpu& w,
                       std::span<const MlaSeqGpu> seqs, const float* x, int64_t n_tok, float* out,
                       int layer) {
  const MlaConfig& m = cfg.mla;
  const int nh = m.n_head, dqk = m.d_qk(), R = m.kv_lora_rank, dl = m.d_latent(), dn = m.d_nope,
            dr = m.d_rope, dv = m.d_v, wkv = m.d_nope + m.d_v;
  DevBuf q, cq, kv, z;
  K3_RETURN_IF_ERROR(q.alloc(c, n_tok * nh * dqk));
  K3_RETURN_IF_ERROR(kv.alloc(c, n_tok * dl));
  K3_RETURN_IF_ERROR(z.alloc(c, n_tok * nh * dv));
  // the projections of x in one GEMV launch at decode sizes; kv: [n_tok, R + d_rope]
  if (m.q_lora_rank > 0) {
    K3_RETURN_IF_ERROR(cq.alloc(c, n_tok * m.q_lora_rank));
    linear_group(c, {{&w.q_a_proj, cq.f()}, {&w.kv_a_proj_with_mqa, kv.f()}}, x, n_tok);
    rms_norm(c, cq.f(), w.q_a_layernorm, 1e-6f, n_tok, m.q_lora_rank, cq.f());
    linear(c, w.q_b_proj, cq.f(), n_tok, q.f());
  } else {
    linear_group(c, {{&w.q_proj, q.f()}, {&w.kv_a_proj_with_mqa, kv.f()}}, x, n_tok);
  }
  rms_norm(c, kv.f(), w.kv_a_layernorm, 1e-6f, n_tok, R, kv.f(), dl, dl);
  c.cb("mla_q", layer, q.f(), n_tok * nh * dqk);
  c.cb("mla_latent", layer, kv.f(), n_tok * dl);

  bool any_abs = false, all_abs = true;
  for (const MlaSeqGpu& s : seqs) {
    any_abs = any_abs || (s.absorbed && s.n_tok > 0);
    all_abs = all_abs && (s.absorbed || s.n_tok <= 0);
  }
  DevBuf qh, zh;
  if (any_abs) {
    K3_RETURN_IF_ERROR(qh.alloc(c, n_tok * nh * dl));
    K3_RETURN_IF_ERROR(zh.alloc(c, n_tok * nh * R));
  }
  const float scale = 1.f / std::sqrt(float(dqk));
  // W_UK / W_UV: the bf16 kv_b_proj itself, or its fp32 copy (weights_gpu.cu makes one for other dtypes)
  auto with_kvb = [&](auto&& launch) {
    if (w.kv_b_f32)
      launch(w.kv_b_f32);
    else
      launch(static_cast<const uint16_t*>(w.kv_b_proj.w));
  };
  const bool fast = c.bf16() && env_switch("K3_MLA_FAST", true);  // read per call: tests switch it
  const bool fast_decode = fast && R == kMlaLatent && dr == kMlaRope;
  const bool fast_prefill = fast && dn == kMlaPrefillNope && dr == kMlaPrefillRope && dv == kMlaPrefillV;
  // DSA's absorbed steps in bf16 mode on ops/mla_sparse.h (K3_DSA_SPARSE_MLA=0, read per call: the generic
  // attention over the selection). 6.8x faster on the K3.1 slice's DSA layer at B = 1 (H200, session 5);
  // its GPU test missed (1.06-1.48e-4) until session 10 found why: the tensor-core kernel rounded the
  // softmax weights to bf16, which model/mla.cpp does not; the op now keeps 16 bits of them (exact_p: two
  // bf16 pieces since session 19, decision gpu.7).
  const bool sparse_mla =
      env_switch("K3_DSA_SPARSE_MLA", true) && c.bf16() && R == kMlaLatent && dr == kMlaRope;
  all_abs = all_abs && any_abs;

  // Append the new rows: fp32 (the state of record) and their bf16 pages; DSA: the index keys too.
  const int Di = w.has_dsa ? cfg.dsa.d_head : 0;
  CallRows cr;
  K3_RETURN_IF_ERROR(call_rows(c, seqs, n_tok, dl, Di, &cr));
  // one pool for every sequence of the model (or none)
  const CachePagesGpu* pg = cr.live.empty() ? nullptr : seqs[size_t(cr.live[0])].st->paged;
  append_rows_kernel<<<blocks_for(n_tok * dl), kThreads, 0, c.stream()>>>(cr.lat, kv.f(), n_tok, dl);
  PageStore ps;
  ps.table = cr.table, ps.max_pages = cr.max_pages, ps.row_seq = cr.row_seq, ps.pos = cr.pos,
  ps.n_rows = n_tok;
  if (pg && pg->latent) {
    ps.pages = pg->latent, ps.width = dl, ps.src = kv.f();
    page_store(ps, c.stream());
  }
  DevBuf kI;
  if (w.has_dsa) {
    K3_RETURN_IF_ERROR(kI.alloc(c, n_tok * Di));
    dsa_keys_gpu(c, cfg, w.dsa, x, n_tok, kI.f(), layer);
    append_rows_kernel<<<blocks_for(n_tok * Di), kThreads, 0, c.stream()>>>(cr.idx, kI.f(), n_tok, Di);
    if (pg && pg->index) {
      ps.pages = pg->index, ps.width = Di, ps.src = kI.f();
      page_store(ps, c.stream());
    }
  }
  // The pages of table rows [k, ..) of the call (one per sequence), or of per-row tables.
  auto lat_pages = [&](const int32_t* table) {
    return PagedRows{pg ? pg->latent : nullptr, table, cr.max_pages, pg ? pg->n_pages : 0};
  };
  auto key_pages = [&](const int32_t* table) {
    return PagedRows{pg ? pg->index : nullptr, table, cr.max_pages, pg ? pg->n_pages : 0};
  };

  // A decode call on the tensor-core kernels: every sequence's rows in one launch each (the pages make one
  // cache of the batch). Dense MLA (K3) on mla_decode; DSA (K3.1): one indexer and top-k launch for all rows,
  // then mla_sparse.
  const bool dsa_fast = w.has_dsa && dsa_fast_fits(c, cfg, pg ? pg->index : nullptr);
  if (all_abs && pg && pg->latent && (w.has_dsa ? dsa_fast && sparse_mla : fast_decode)) {
    with_kvb([&](auto kvb) { absorb_q(c, qh.f(), q.f(), kvb, n_tok, nh, dn, dr, R, wkv); });
    DevBuf q16, rt, sel;
    K3_RETURN_IF_ERROR(to_bf16(c, qh.f(), n_tok * nh * dl, &q16));
    const int32_t* table = cr.table;  // one row per sequence = one per query row when each adds one token
    if (int64_t(cr.live.size()) != n_tok) {
      K3_RETURN_IF_ERROR(row_tables(c, cr, 0, n_tok, &rt));
      table = rt.as<int32_t>();
    }
    if (w.has_dsa) {
      K3_RETURN_IF_ERROR(dsa_select_rows_gpu(c, cfg, w.dsa, cq.f(), x, n_tok, cr.ctx, cr.max_ctx,
                                             key_pages(table), &sel, layer));
      K3_RETURN_IF_ERROR(sparse_rows(c, q16.as<uint16_t>(), lat_pages(table), false, sel.as<int32_t>(), n_tok,
                                     nh, cfg.dsa.topk, scale, zh.f()));
    } else {
      K3_RETURN_IF_ERROR(
          decode_rows(c, q16.as<uint16_t>(), lat_pages(table), cr.ctx, cr.max_ctx, n_tok, nh, scale, zh.f()));
    }
    with_kvb([&](auto kvb) { expand_z(c, z.f(), zh.f(), kvb, n_tok, nh, dn, dv, R, wkv); });
    return finish(c, cfg, w, x, n_tok, z.f(), out, layer);
  }

  if (all_abs)  // a decode step: W_UK read once for every sequence's rows; bf16 mode: q^ in bf16
                // (model/mla.cpp)
    with_kvb([&](auto kvb) { absorb_q(c, qh.f(), q.f(), kvb, n_tok, nh, dn, dr, R, wkv); });
  for (size_t k = 0; k < cr.live.size(); ++k) {
    const MlaSeqGpu& s = seqs[size_t(cr.live[k])];
    MlaStateGpu& st = *s.st;
    const int64_t n_ctx = s.n_past + s.n_tok;
    const int32_t* own = cr.table + int64_t(k) * cr.max_pages;  // this sequence's table row
    DevBuf sel;
    bool sparse = false;
    if (w.has_dsa)
      K3_RETURN_IF_ERROR(dsa_select_gpu(c, cfg, w.dsa, cq.f() + s.row0 * m.q_lora_rank,
                                        x + s.row0 * cfg.d_model, s.n_past, s.n_tok, st.index_k,
                                        key_pages(own), &sel, &sparse, layer));
    AttentionParams p;
    p.n_q = s.n_tok;
    p.n_kv = n_ctx;
    p.n_head = nh;
    p.q_pos0 = s.n_past;
    p.sel = sparse ? sel.as<int32_t>() : nullptr;
    p.n_sel = sparse ? cfg.dsa.topk : 0;
    p.scale = scale;
    if (!s.absorbed) {
      DevBuf kvb, K;
      K3_RETURN_IF_ERROR(kvb.alloc(c, n_ctx * nh * wkv));
      linear(c, w.kv_b_proj, st.latent, n_ctx, kvb.f(), true, false, /*ldx=*/dl);  // [n_ctx, nh * wkv]
      if (fast_prefill && !sparse) {
        K3_RETURN_IF_ERROR(prefill_fast(c, q.f() + s.row0 * nh * dqk, kvb.f(), st, s.n_tok, s.n_past, nh, R,
                                        scale, z.f() + s.row0 * nh * dv));
        continue;
      }
      K3_RETURN_IF_ERROR(K.alloc(c, n_ctx * nh * dqk));
      build_k_kernel<<<blocks_for(n_ctx * nh * dqk), kThreads, 0, c.stream()>>>(
          K.f(), kvb.f(), st.latent, n_ctx, nh, dn, dr, R, dl, wkv);
      p.d_qk = dqk, p.d_v = dv;
      p.q = q.f() + s.row0 * nh * dqk, p.q_tok_stride = int64_t(nh) * dqk, p.q_head_stride = dqk;
      p.k = K.f(), p.k_tok_stride = int64_t(nh) * dqk, p.k_head_stride = dqk;
      p.v = kvb.f() + dn, p.v_tok_stride = int64_t(nh) * wkv, p.v_head_stride = wkv;
      p.out = z.f() + s.row0 * nh * dv;
      attention_cuda(p, *c.g);
      continue;
    }
    // MQA over the latent rows: k = [c | r], v = c.
    float* qs = qh.f() + s.row0 * nh * dl;
    float* zs = zh.f() + s.row0 * nh * R;
    if (!all_abs)  // bf16 mode: q^ in bf16 (model/mla.cpp)
      with_kvb(
          [&](auto kvb) { absorb_q(c, qs, q.f() + s.row0 * nh * dqk, kvb, s.n_tok, nh, dn, dr, R, wkv); });
    if (fast_decode && !sparse && pg && pg->latent) {
      DevBuf q16, rt;
      K3_RETURN_IF_ERROR(to_bf16(c, qs, s.n_tok * nh * dl, &q16));
      K3_RETURN_IF_ERROR(row_tables(c, cr, s.row0, s.n_tok, &rt));
      K3_RETURN_IF_ERROR(decode_rows(c, q16.as<uint16_t>(), lat_pages(rt.as<int32_t>()), cr.ctx + s.row0,
                                     n_ctx, s.n_tok, nh, scale, zs));
    } else if (sparse_mla && sparse && pg && pg->latent) {
      DevBuf q16;
      K3_RETURN_IF_ERROR(to_bf16(c, qs, s.n_tok * nh * dl, &q16));
      K3_RETURN_IF_ERROR(sparse_rows(c, q16.as<uint16_t>(), lat_pages(own), true, sel.as<int32_t>(), s.n_tok,
                                     nh, cfg.dsa.topk, scale, zs));
    } else {
      p.d_qk = dl, p.d_v = R;
      p.q = qs, p.q_tok_stride = int64_t(nh) * dl, p.q_head_stride = dl;
      p.k = st.latent, p.k_tok_stride = dl, p.k_head_stride = 0;
      p.v = st.latent, p.v_tok_stride = dl, p.v_head_stride = 0;
      p.out = zs;
      attention_cuda(p, *c.g);
    }
    if (!all_abs)
      with_kvb(
          [&](auto kvb) { expand_z(c, z.f() + s.row0 * nh * dv, zs, kvb, s.n_tok, nh, dn, dv, R, wkv); });
  }
  if (all_abs)  // a decode step: W_UV read once for every sequence's rows
    with_kvb([&](auto kvb) { expand_z(c, z.f(), zh.f(), kvb, n_tok, nh, dn, dv, R, wkv); });
  return finish(c, cfg, w, x, n_tok, z.f(), out, layer);
}

}  // namespace k3::gpu
