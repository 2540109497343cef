// model_gpu.cu: the GPU layer loop (model_gpu.h), a line-for-line twin of model/model.cpp Model::run.
#include "gpu/model_gpu.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "core/cuda_check.h"
#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "gpu/context.h"
#include "gpu/model_impl_gpu.cuh"
#include "gpu/step_graph.cuh"
#include "model/batch.h"
#include "model/binder.h"

namespace k3::gpu {

namespace {

__global__ void embed_kernel(float* x0, const void* table, int dtype, const int32_t* tokens, int64_t n_tok,
                             int64_t D) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tok * D) return;
  const int64_t src = int64_t(tokens[i / D]) * D + i % D;
  if (dtype == 0) {
    x0[i] = static_cast<const float*>(table)[src];
  } else if (dtype == 1) {
    x0[i] = __uint_as_float(uint32_t(static_cast<const uint16_t*>(table)[src]) << 16);  // bf16
  } else {
    x0[i] = __half2float(static_cast<const __half*>(table)[src]);
  }
}

}  // namespace

Status embed_gpu(const GpuCtx& c, const ModelWeightsGpu& w, int64_t D, const int32_t* tokens, int64_t n_tok,
                 float* x0) {
  const int dt = w.embed_dtype == DType::f32 ? 0 : (w.embed_dtype == DType::bf16 ? 1 : 2);
  embed_kernel<<<blocks_for(n_tok * D), kThreads, 0, c.stream()>>>(x0, w.embed, dt, tokens, n_tok, D);
  return launch_status("embedding");
}

GpuModel::GpuModel(const ModelConfig& cfg, const ModelOptions& opt) : cfg_(cfg), opt_(opt) {
  graphs_on_ = opt.cuda_graph || env_switch("K3_CUDA_GRAPH", false);  // opt-in (docs/perf.md)
}
GpuModel::~GpuModel() {
  if (impl_) cudaSetDevice(device_);
}

size_t GpuModel::weight_bytes() const {
  return impl_->w->bytes;
}

Result<std::unique_ptr<GpuModel>> GpuModel::load(const Checkpoint& ckpt, const ModelOptions& opt,
                                                 int device) {
  if (opt.kda_chunk <= 0) return error(Code::invalid_argument, "kda_chunk must be positive");
  const int n_dev = cuda::device_count();
  if (n_dev == 0) return error(Code::unsupported, "no CUDA device");
  if (device < 0 || device >= n_dev)
    return error(Code::invalid_argument,
                 "CUDA device " + std::to_string(device) + " of " + std::to_string(n_dev));
  K3_CUDA_CHECK(cudaSetDevice(device));
  // Keep freed scratch in the stream-ordered pool instead of returning it to the driver at every sync.
  cudaMemPool_t pool;
  K3_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  K3_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

  std::unique_ptr<GpuModel> m(new GpuModel(ckpt.config(), opt));
  m->impl_ = std::make_unique<Impl>();
  m->device_ = device;
  ContextOptions co;
  co.device = device;
  co.allow_tf32 = false;
  K3_RETURN_IF_ERROR(m->impl_->ctx.create(co));
  // K3_MOE_OVERLAP (default on): the shared experts of a MoE layer run on a second stream beside the routed
  // path (moe_gpu.cu). Both streams at the same priority: with the side stream below the main one, the K3
  // slice's B = 1 step took 2.78 ms instead of 2.70 (session 9, docs/perf.md).
  if (env_switch("K3_MOE_OVERLAP", true) && ckpt.config().moe.n_shared_expert > 0) {
    Impl& im = *m->impl_;
    ContextOptions so = co;
    so.workspace_bytes = size_t(64) << 20;
    K3_RETURN_IF_ERROR(im.side_ctx.create(so));
    K3_CUDA_CHECK(cudaEventCreateWithFlags(&im.side.fork, cudaEventDisableTiming));
    K3_CUDA_CHECK(cudaEventCreateWithFlags(&im.side.join, cudaEventDisableTiming));
    im.side.g = &im.side_ctx.get();
  }
  K3_ASSIGN_OR_RETURN(auto host_w, bind_model(ckpt));
  K3_ASSIGN_OR_RETURN(m->impl_->w, upload_model(*host_w, ckpt.config(), m->impl_->ctx.get()));
  return Result<std::unique_ptr<GpuModel>>(std::move(m));
}

bool defer_residual_add(const GpuCtx& c, bool attn_res, bool injecting) {
  static const bool on = env_switch("K3_FUSE_ADD", true);
#ifdef NDEBUG
  const bool checked = false;
#else
  const bool checked = true;  // cb checks every traced activation for NaN / Inf
#endif
  return on && attn_res && !injecting && !checked && !c.tracing();
}

Status GpuModel::run(std::span<GpuSeqState* const> states, const int32_t* tokens,
                     std::span<const int64_t> row0, std::span<const int64_t> out_rows, float* logits) {
  const int64_t D = cfg_.d_model, V = cfg_.n_vocab, n_seq = int64_t(states.size()), n_tok = row0.back();
  const ModelWeightsGpu& W = *impl_->w;
  if (profile_) return run_pieces(states, tokens, row0, out_rows, logits);  // the piece loop, timed
  K3_CUDA_CHECK(cudaSetDevice(device_));
  for (int64_t i = 0; i < n_seq; ++i)
    K3_RETURN_IF_ERROR(
        states[size_t(i)]->reserve(states[size_t(i)]->n_past_ + row0[size_t(i) + 1] - row0[size_t(i)]));
  Status guard;
  GpuCtx c;
  init_ctx(&c, &guard);
  KdaExec kx;
  kx.recurrent = opt_.kda_recurrent;
  kx.chunk = opt_.kda_chunk;
  const float eps = cfg_.rms_norm_eps;

  // x0 = embed_tokens[id]
  DevBuf tok, p, a, h, o;
  K3_RETURN_IF_ERROR(tok.alloc_bytes(c, size_t(n_tok) * 4));
  for (DevBuf* b : {&p, &a, &h, &o}) K3_RETURN_IF_ERROR(b->alloc(c, n_tok * D));
  K3_CUDA_CHECK(cudaMemcpyAsync(tok.f(), tokens, size_t(n_tok) * 4, cudaMemcpyHostToDevice, c.stream()));
  K3_RETURN_IF_ERROR(embed_gpu(c, W, D, tok.as<int32_t>(), n_tok, p.f()));
  c.cb("embd", -1, p.f(), n_tok * D);

  std::vector<KdaSeqGpu> kseq(static_cast<size_t>(n_seq));
  std::vector<MlaSeqGpu> mseq(static_cast<size_t>(n_seq));
  std::vector<DevBuf> B;  // AttnRes: finished block sums (bf16), [n_tok, D] each
  auto sources = [&] {
    std::vector<const float*> src;
    for (const DevBuf& b : B) src.push_back(b.f());
    src.push_back(p.f());
    return src;
  };
  const bool ar = cfg_.uses_attn_res();
  // p += o (rounded), now or owed to the next AttnRes kernel (defer_residual_add)
  const bool defer = defer_residual_add(c, ar, inject_ != nullptr);
  ResidualAdd owed;
  auto add = [&](const char* name, int l) {
    if (defer) {
      owed = {p.f(), o.f()};
      return;
    }
    add_inplace(c, p.f(), o.f(), n_tok * D, /*round=*/true);
    if (name) c.cb(name, l, p.f(), n_tok * D);
  };
  auto settle = [&] { return std::exchange(owed, ResidualAdd{}); };
  auto inject = [&](int layer) -> Status {  // set_layer_inputs: the residual stream from outside
    const float* h = inject_ ? inject_(layer, n_tok * D) : nullptr;
    if (h)
      K3_CUDA_CHECK(cudaMemcpyAsync(p.f(), h, size_t(n_tok * D) * 4, cudaMemcpyHostToDevice, c.stream()));
    return ok_status();
  };
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeightsGpu& lw = W.layers[size_t(l)];
    if (l > 0) K3_RETURN_IF_ERROR(inject(l - 1));
    // attention sub-layer
    const bool fresh = ar && l % cfg_.attn_res_block_size == 0;
    if (ar && l > 0)
      K3_RETURN_IF_ERROR(attn_res_norm_gpu(c, sources(), lw.q_attn_res, eps, n_tok, D, lw.input_layernorm,
                                           a.f(), h.f(), settle()));
    else
      rms_norm(c, p.f(), lw.input_layernorm, eps, n_tok, D, h.f());
    c.cb("attn_norm", l, h.f(), n_tok * D);
    for (int64_t i = 0; i < n_seq; ++i) {
      GpuSeqState& st = *states[size_t(i)];
      const int64_t r = row0[size_t(i)], n = row0[size_t(i) + 1] - r;
      kseq[size_t(i)] = {&st.kda[size_t(l)], r, n};
      const bool absorbed = opt_.mla == MlaPath::absorbed || (opt_.mla == MlaPath::auto_ && n == 1);
      mseq[size_t(i)] = {&st.mla[size_t(l)], r, n, st.n_past_, absorbed};
    }
    if (lw.kind == AttnKind::kda)
      K3_RETURN_IF_ERROR(kda_forward_gpu(c, cfg_, lw.kda, kx, kseq, h.f(), n_tok, o.f(), l));
    else
      K3_RETURN_IF_ERROR(mla_forward_gpu(c, cfg_, lw.mla, mseq, h.f(), n_tok, o.f(), l));
    c.cb("attn_out", l, o.f(), n_tok * D);
    if (fresh) {  // the partial sum so far becomes a finished block; the new one starts at the attention
                  // output
      B.push_back(std::move(p));
      p = std::move(o);
      K3_RETURN_IF_ERROR(o.alloc(c, n_tok * D));
    } else {
      add(nullptr, l);
    }
    // FFN sub-layer
    if (ar)
      K3_RETURN_IF_ERROR(attn_res_norm_gpu(c, sources(), lw.q_mlp_res, eps, n_tok, D,
                                           lw.post_attention_layernorm, a.f(), h.f(), settle()));
    else
      rms_norm(c, p.f(), lw.post_attention_layernorm, eps, n_tok, D, h.f());
    c.cb("ffn_norm", l, h.f(), n_tok * D);
    if (lw.moe)
      K3_RETURN_IF_ERROR(moe_forward_gpu(c, cfg_, lw.moe_w, h.f(), n_tok, o.f(), l));
    else
      K3_RETURN_IF_ERROR(ffn_forward_gpu(c, cfg_, lw.mlp, h.f(), n_tok, o.f()));
    c.cb("ffn_out", l, o.f(), n_tok * D);
    add("l_out", l);
    if (!guard.ok()) return guard;
    K3_RETURN_IF_ERROR(launch_status("layer loop"));
  }
  K3_RETURN_IF_ERROR(inject(cfg_.n_layer - 1));
  const float* fin = p.f();
  if (ar) {
    K3_RETURN_IF_ERROR(attn_res_mix_gpu(c, sources(), W.q_out_res, eps, n_tok, D, a.f(), settle()));
    fin = a.f();
  }
  for (int64_t i = 0; i < n_seq; ++i) states[size_t(i)]->n_past_ += row0[size_t(i) + 1] - row0[size_t(i)];

  // logits = lm_head RMSNorm(h; model.norm), fp32 output, only for the requested rows
  const int64_t n_out = int64_t(out_rows.size());
  DevBuf rows, z;
  K3_RETURN_IF_ERROR(rows.alloc_bytes(c, size_t(n_out) * 8));
  K3_RETURN_IF_ERROR(z.alloc(c, n_out * V));
  K3_CUDA_CHECK(
      cudaMemcpyAsync(rows.f(), out_rows.data(), size_t(n_out) * 8, cudaMemcpyHostToDevice, c.stream()));
  gather_rows(c, o.f(), fin, rows.as<int64_t>(), n_out, D);
  rms_norm(c, o.f(), W.norm, eps, n_out, D, h.f());
  c.cb("result_norm", cfg_.n_layer, h.f(), n_out * D);
  if (logits) {
    linear(c, W.lm_head, h.f(), n_out, z.f(), /*round=*/false);
    c.cb("result_output", cfg_.n_layer, z.f(), n_out * V);
    K3_CUDA_CHECK(cudaMemcpyAsync(logits, z.f(), size_t(n_out * V) * 4, cudaMemcpyDeviceToHost, c.stream()));
  }
  K3_RETURN_IF_ERROR(launch_status("logits"));
  K3_RETURN_IF_ERROR(synchronize(*c.g));
  return guard;
}

Status GpuModel::forward(GpuSeqState& state, const int32_t* tokens, int64_t n_tok, std::vector<float>* logits,
                         bool all_logits) {
  K3_RETURN_IF_ERROR(check_tokens(tokens, n_tok, cfg_.n_vocab));
  if (n_tok <= 0) {
    if (logits) logits->clear();
    return ok_status();
  }
  GpuSeqState* states[1] = {&state};
  if (n_tok == 1 && graph_step_ok(1)) {
    std::vector<float> tmp;
    if (!logits) logits = &tmp;
    logits->resize(size_t(cfg_.n_vocab));
    return run_graph_step(states, tokens, logits->data());
  }
  const int64_t row0[2] = {0, n_tok};
  std::vector<int64_t> out_rows;
  for (int64_t t = all_logits ? 0 : n_tok - 1; t < n_tok; ++t) out_rows.push_back(t);
  if (logits) logits->resize(out_rows.size() * size_t(cfg_.n_vocab));
  return run(states, tokens, row0, out_rows, logits ? logits->data() : nullptr);
}

Status GpuModel::forward_batch(std::span<GpuSeqState*> states,
                               std::span<const std::span<const int32_t>> tokens,
                               std::vector<std::vector<float>>* last_logits) {
  PackedBatch<GpuSeqState> b;
  K3_RETURN_IF_ERROR(pack_batch(states, tokens, cfg_.n_vocab, &b));
  // Host buffers are reused across calls (a fresh zeroed [B, V] vector per step page-faulted 42 MB in at
  // B = 64 for K3); a graph step leaves its logits in its pinned staging buffer, read from there.
  const float* logits = nullptr;
  const bool decode = b.tokens.size() == b.live.size();  // one token per live sequence
  if (!b.live.empty() && decode && graph_step_ok(b.live.size())) {
    K3_RETURN_IF_ERROR(run_graph_step(b.live, b.tokens.data(), nullptr));
    logits = impl_->z_h;
  } else if (!b.live.empty()) {
    std::vector<float>& buf = impl_->logits;
    if (buf.size() < b.out_rows.size() * size_t(cfg_.n_vocab))
      buf.resize(b.out_rows.size() * size_t(cfg_.n_vocab));
    K3_RETURN_IF_ERROR(run(b.live, b.tokens.data(), b.row0, b.out_rows, buf.data()));
    logits = buf.data();
  }
  if (!last_logits) return ok_status();
  // At B = 64 the rows are 42 MB for K3 (the vocabulary of 163840): one thread copying them took longer
  // than the last layers of the step; from 2 MB (B >= 4 for K3) several do.
  ThreadPool* pool = nullptr;
  if (b.live.size() * size_t(cfg_.n_vocab) * 4 >= (size_t(2) << 20)) {
    if (!impl_->copy_pool)
      impl_->copy_pool =
          std::make_unique<ThreadPool>(int(std::min(8u, std::max(1u, std::thread::hardware_concurrency()))));
    pool = impl_->copy_pool.get();
  }
  unpack_last_logits(tokens, logits, cfg_.n_vocab, last_logits, pool);
  return ok_status();
}

}  // namespace k3::gpu
