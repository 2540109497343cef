// blocks_gpu.cuh: the GPU model blocks, one file each (kda_gpu.cu, mla_gpu.cu, dsa_gpu.cu, ffn_gpu.cu,
// moe_gpu.cu, attn_res_gpu.cu), called by the layer loop in model_gpu.cu. Internal to src/gpu.
//
// Each block mirrors its CPU twin in src/model/ line for line: the same equations (MODEL.md section named in
// the CPU file), the same bf16 rounding points (c.rnd) and the same trace names (c.cb), with device pointers.
// x / out are device arrays [n_rows, D]; per-sequence state lives in GpuSeqState (model_gpu.h).
#pragma once

#include <span>
#include <vector>

#include "gpu/common_gpu.cuh"
#include "gpu/model_gpu.h"
#include "gpu/weights_gpu.h"
#include "model/kda.h"

namespace k3::gpu {

// One sequence of a batch: rows [row0, row0 + n_tok) of x / out, continuing from *st.
struct KdaSeqGpu {
  KdaStateGpu* st = nullptr;
  int64_t row0 = 0, n_tok = 0;
};
struct MlaSeqGpu {
  MlaStateGpu* st = nullptr;
  int64_t row0 = 0, n_tok = 0, n_past = 0;
  bool absorbed = false;
};

// x0[t, :] = embed[tokens[t], :] as fp32 (tokens: device int32 [n_tok]).
Status embed_gpu(const GpuCtx& c, const ModelWeightsGpu& w, int64_t d_model, const int32_t* tokens,
                 int64_t n_tok, float* x0);

// The projections of a KDA layer's input x, one GEMV launch at decode sizes (the same results as one linear()
// each): qt, kt, vt [n_tok, H K]; the beta logits bt [n_tok, H] (sigmoid after: MODEL.md §13 #16); the decay
// input g = f_b(f_a(x)) [n_tok, H K]; the output gate [n_tok, H K] (full rank, or g_b(g_a(x))).
Status kda_project_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w, const float* x,
                       int64_t n_tok, float* qt, float* kt, float* vt, float* bt, float* g, float* gate);
Status kda_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w, const KdaExec& ex,
                       std::span<const KdaSeqGpu> seqs, const float* x, int64_t n_rows, float* out,
                       int layer);

// Absorbed MLA's per-head products (mla_absorb_gpu.cu), TW = uint16_t (the bf16 kv_b_proj) or float (its
// fp32 copy): q^ rows qh [n_tok, nh, R + dr] from q [n_tok, nh, dn + dr] (bf16-rounded in bf16 mode), and
// z [n_tok, nh, dv] from z^ rows zh [n_tok, nh, R]; wkv = dn + dv.
template <class TW>
void absorb_q(const GpuCtx& c, float* qh, const float* q, const TW* kvb, int64_t n_tok, int nh, int dn,
              int dr, int R, int wkv);
template <class TW>
void expand_z(const GpuCtx& c, float* z, const float* zh, const TW* kvb, int64_t n_tok, int nh, int dn,
              int dv, int R, int wkv);

Status mla_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const MlaWeightsGpu& w,
                       std::span<const MlaSeqGpu> seqs, const float* x, int64_t n_rows, float* out,
                       int layer);

// bf16 rows in pages of the model's pool (cache_pool_gpu.cuh) and a block table: query row (or sequence) b
// reads position s from page table[b * max_pages + s / kCachePage].
struct PagedRows {
  const uint16_t* pages = nullptr;
  const int32_t* table = nullptr;
  int max_pages = 0;
  int64_t n_pages = 0;
};

// DSA (dsa.h), in three parts. The index keys of the call's rows x [n_tok, D]: kI [n_tok, Di] =
// bf16(LayerNorm(wk x)) (traced "dsa_k"); mla_gpu.cu appends them to the caches.
void dsa_keys_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* x,
                  int64_t n_tok, float* kI, int layer);
// Whether the selection runs on the tensor-core indexer and radix top-k: bf16 mode, <= 64 index heads, and
// the keys in pages (key_pages: the layer's array, which the pool has only for the indexer's key shapes,
// cache_pool_gpu.cuh); else the generic kernels over the fp32 keys.
bool dsa_fast_fits(const GpuCtx& c, const ModelConfig& cfg, const uint16_t* key_pages);
// One sequence (its keys appended already): when some query sees more than topk positions, fills sel
// [n_tok, topk] (device int32, -1 padded, ascending positions) and sets *sparse. cq: the q_a_layernorm
// output rows of this sequence; x: its attention input rows; index_k: its fp32 keys [n_past + n_tok, Di];
// keys: the same in pages (table row 0 = this sequence), used when dsa_fast_fits.
Status dsa_select_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* cq,
                      const float* x, int64_t n_past, int64_t n_tok, const float* index_k,
                      const PagedRows& keys, DevBuf* sel, bool* sparse, int layer);
// A decode call's rows at once (dsa_fast_fits): row r sees ctx[r] positions (device int32, each <= max_ctx)
// of the keys of table row r; sel [n_rows, topk] as above (every visible position where ctx[r] <= topk).
Status dsa_select_rows_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* cq,
                           const float* x, int64_t n_rows, const int32_t* ctx, int64_t max_ctx,
                           const PagedRows& keys, DevBuf* sel, int layer);

// GLU MLP: out [n_tok, d_in] = down(act(gate x, up x)). gu: scratch [2, n_tok, d_ff] (nullptr: allocated
// here; a caller running this on a side stream passes its own, see fork_side).
Status ffn_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const FfnWeights& w, const float* x,
                       int64_t n_tok, float* out, float* gu = nullptr);

Status moe_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const MoeWeightsGpu& w, const float* x,
                       int64_t n_tok, float* out, int layer);

// A residual add still owed to the partial sum (the last AttnRes source): p <- round(p + o) elementwise
// (bf16 mode; add_inplace's rounding), done by the AttnRes kernel that reads p next, before it uses p.
// p must be the last source. Empty: nothing owed.
struct ResidualAdd {
  float* p = nullptr;
  const float* o = nullptr;
};

// Block AttnRes: out = bf16(sum_i softmax_i(q . V_i rsqrt(mean V_i^2 + eps)) V_i) over the sources.
Status attn_res_mix_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                        int64_t n_tok, int64_t d_model, float* out, ResidualAdd add = {});
// The mix followed by RMSNorm(a; w, eps) (the norm before each sub-layer): a = the mix (written), y = the
// norm.
Status attn_res_norm_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                         int64_t n_tok, int64_t d_model, const float* w, float* a, float* y,
                         ResidualAdd add = {});

}  // namespace k3::gpu
