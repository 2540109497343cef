// weights_gpu.cu: uploading the CPU weight binding to the device (weights_gpu.h).
//
// One walk over ModelWeights, run twice: the first pass only adds up the (256-byte aligned) sizes, the
// second allocates them from one DeviceArena and copies. So the walk is written once and the arena is
// exactly as large as the weights.
#include "gpu/weights_gpu.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "model/binder.h"

namespace k3::gpu {

namespace {

constexpr size_t kAlign = 256;

class Uploader {
 public:
  explicit Uploader(DeviceArena* arena) : arena_(arena) {}  // null arena: sizing pass
  size_t bytes() const { return bytes_; }
  const Status& status() const { return st_; }

  const void* raw(const void* host, size_t n) {
    bytes_ += (n + kAlign - 1) / kAlign * kAlign;
    if (!arena_ || !st_.ok() || n == 0) return nullptr;
    Result<void*> r = arena_->alloc_bytes(n, kAlign);
    if (!r.ok()) {
      st_ = r.status();
      return nullptr;
    }
    const cudaError_t e = cudaMemcpy(r.value(), host, n, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) st_ = error(Code::internal, std::string("weight upload: ") + cudaGetErrorString(e));
    return r.value();
  }
  const float* vec(const std::vector<float>& v) {
    return v.empty() ? nullptr : static_cast<const float*>(raw(v.data(), v.size() * 4));
  }
  LinearWeight lin(const LinearWeight& h) {
    LinearWeight d = h;
    if (!h.w) return d;  // absent (optional) weight stays absent
    if (h.is_mxfp4()) {
      d.w = raw(h.w, size_t(h.out * h.in / 2));
      d.scale = static_cast<const uint8_t*>(raw(h.scale, size_t(h.out * h.in / 32)));
    } else {
      d.w = raw(h.w, size_t(h.out * h.in) * dtype_size(h.dtype));
    }
    return d;
  }
  FfnWeights ffn(const FfnWeights& h) { return {lin(h.gate_proj), lin(h.up_proj), lin(h.down_proj)}; }

 private:
  DeviceArena* arena_;
  size_t bytes_ = 0;
  Status st_;
};

void walk_kda(Uploader& u, const KdaWeights& h, KdaWeightsGpu* d) {
  d->q_proj = u.lin(h.q_proj), d->k_proj = u.lin(h.k_proj), d->v_proj = u.lin(h.v_proj);
  d->q_conv = u.vec(h.q_conv), d->k_conv = u.vec(h.k_conv), d->v_conv = u.vec(h.v_conv);
  d->f_a_proj = u.lin(h.f_a_proj), d->f_b_proj = u.lin(h.f_b_proj);
  d->dt_bias = u.vec(h.dt_bias), d->A_log = u.vec(h.A_log);
  d->b_proj = u.lin(h.b_proj);
  d->g_proj = u.lin(h.g_proj), d->g_a_proj = u.lin(h.g_a_proj), d->g_b_proj = u.lin(h.g_b_proj);
  d->o_norm = u.vec(h.o_norm);
  d->o_proj = u.lin(h.o_proj);
}

void walk_mla(Uploader& u, const MlaWeights& h, MlaWeightsGpu* d) {
  d->q_proj = u.lin(h.q_proj), d->q_a_proj = u.lin(h.q_a_proj), d->q_b_proj = u.lin(h.q_b_proj);
  d->q_a_layernorm = u.vec(h.q_a_layernorm);
  d->kv_a_proj_with_mqa = u.lin(h.kv_a_proj_with_mqa);
  d->kv_a_layernorm = u.vec(h.kv_a_layernorm);
  d->kv_b_proj = u.lin(h.kv_b_proj);
  if (d->kv_b_proj.dtype != DType::bf16 || d->kv_b_proj.is_mxfp4()) {  // bf16: the kernels read it in place
    std::vector<float> kvb(size_t(h.kv_b->numel()));
    read_f32(*h.kv_b, 0, h.kv_b->numel(), kvb.data());
    d->kv_b_f32 = u.vec(kvb);
  }
  d->o_proj = u.lin(h.o_proj), d->g_proj = u.lin(h.g_proj);
  d->has_dsa = h.has_dsa;
  if (h.has_dsa) {
    d->dsa.wq_b = u.lin(h.dsa.wq_b), d->dsa.wk = u.lin(h.dsa.wk);
    d->dsa.weights_proj = u.lin(h.dsa.weights_proj);
    d->dsa.k_norm_w = u.vec(h.dsa.k_norm_w), d->dsa.k_norm_b = u.vec(h.dsa.k_norm_b);
  }
}

// MoE re-layout for the fused kernels (ops/moe_route.h, ops/moe_experts.h), the default since session 4
// (checked on the H200: ops, tiny models and the K3 slice's layers = CPU). K3_MOE_FAST=0 in the environment
// at load time keeps the first GPU version (separate gate / latent_down, no table, routing copied to the
// host), which moe_gpu.cu still serves (fp32 mode and bf16 experts always take it). With the default, a
// bf16 router and latent down-projection with the same input width go into one [n_expert + d_latent, D]
// matrix (gate and latent_down are views of its two row ranges, so nothing is stored twice), and MXFP4
// experts keep their checkpoint layout and get a device table of per-expert pointers.
bool moe_fast_requested() {
  return env_switch("K3_MOE_FAST", true);
}

void walk_moe(Uploader& u, const MoeWeights& h, MoeWeightsGpu* d) {
  const bool fast = moe_fast_requested();
  const bool fuse = fast && h.gate.w && h.latent_down.w && !h.gate.is_mxfp4() && !h.latent_down.is_mxfp4() &&
                    h.gate.dtype == DType::bf16 && h.latent_down.dtype == DType::bf16 && h.gate.in == h.latent_down.in;
  if (fuse) {
    const size_t gb = size_t(h.gate.out * h.gate.in) * 2, lb = size_t(h.latent_down.out * h.latent_down.in) * 2;
    std::vector<uint8_t> cat(gb + lb);
    std::memcpy(cat.data(), h.gate.w, gb);
    std::memcpy(cat.data() + gb, h.latent_down.w, lb);
    d->gate_down = h.gate;
    d->gate_down.out = h.gate.out + h.latent_down.out;
    d->gate_down.w = u.raw(cat.data(), cat.size());
    d->gate = h.gate, d->gate.w = d->gate_down.w;
    d->latent_down = h.latent_down;
    d->latent_down.w = d->gate_down.w ? static_cast<const uint8_t*>(d->gate_down.w) + gb : nullptr;
  } else {
    d->gate = u.lin(h.gate);
    d->latent_down = u.lin(h.latent_down);
  }
  d->bias = u.vec(h.bias);
  d->experts.clear();
  bool all_mxfp4 = !h.experts.empty();
  for (const FfnWeights& e : h.experts) {
    d->experts.push_back(u.ffn(e));
    all_mxfp4 = all_mxfp4 && e.gate_proj.is_mxfp4() && e.up_proj.is_mxfp4() && e.down_proj.is_mxfp4();
  }
  if (fast && all_mxfp4) {
    std::vector<MoeExpertPtrs> table;
    for (const FfnWeights& e : d->experts)
      table.push_back({static_cast<const uint8_t*>(e.gate_proj.w), e.gate_proj.scale,
                       static_cast<const uint8_t*>(e.up_proj.w), e.up_proj.scale,
                       static_cast<const uint8_t*>(e.down_proj.w), e.down_proj.scale});
    d->expert_table = static_cast<const MoeExpertPtrs*>(u.raw(table.data(), table.size() * sizeof(MoeExpertPtrs)));
  }
  d->shared = u.ffn(h.shared);
  d->latent_up = u.lin(h.latent_up);
  d->latent_norm = u.vec(h.latent_norm);
}

void walk(Uploader& u, const ModelWeights& h, ModelWeightsGpu* d) {
  const TensorView& e = *h.embed;
  d->embed_dtype = e.dtype;
  d->embed = u.raw(e.data, size_t(e.numel()) * dtype_size(e.dtype));
  d->norm = u.vec(h.norm);
  d->lm_head = u.lin(h.lm_head);
  d->q_out_res = u.vec(h.q_out_res);
  d->layers.resize(h.layers.size());
  for (size_t l = 0; l < h.layers.size(); ++l) {
    const LayerWeights& hl = h.layers[l];
    LayerWeightsGpu& dl = d->layers[l];
    dl.kind = hl.kind, dl.moe = hl.moe;
    dl.input_layernorm = u.vec(hl.input_layernorm);
    dl.post_attention_layernorm = u.vec(hl.post_attention_layernorm);
    dl.q_attn_res = u.vec(hl.q_attn_res), dl.q_mlp_res = u.vec(hl.q_mlp_res);
    if (hl.kind == AttnKind::kda)
      walk_kda(u, hl.kda, &dl.kda);
    else
      walk_mla(u, hl.mla, &dl.mla);
    if (hl.moe)
      walk_moe(u, hl.moe_w, &dl.moe_w);
    else
      dl.mlp = u.ffn(hl.mlp);
  }
}

}  // namespace

Result<std::unique_ptr<ModelWeightsGpu>> upload_model(const ModelWeights& host, const ModelConfig& cfg,
                                                      GpuContext& g) {
  auto d = std::make_unique<ModelWeightsGpu>();
  Uploader sizing(nullptr);
  walk(sizing, host, d.get());
  K3_RETURN_IF_ERROR(d->arena.init(sizing.bytes() + kAlign, "GPU weights").with_context("uploading weights"));
  Uploader fill(&d->arena);
  walk(fill, host, d.get());
  K3_RETURN_IF_ERROR(fill.status());
  d->bytes = fill.bytes();
  return Result<std::unique_ptr<ModelWeightsGpu>>(std::move(d));
}

}  // namespace k3::gpu
