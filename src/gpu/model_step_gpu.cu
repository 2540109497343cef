// model_step_gpu.cu: the GPU layer loop as pieces (step_graph.cuh) for CUDA-graph decode steps and profiled
// calls: the same blocks, kernels and order as GpuModel::run's loop in model_gpu.cu (which stays the default
// eager path until this one has been checked on a GPU: tests/cpp/test_gpu_graph.cpp compares the two bit for
// bit), with the host bookkeeping outside the pieces and every inter-piece buffer made up front.
#include <utility>

#include "core/cuda_check.h"
#include "gpu/blocks_gpu.cuh"
#include "gpu/model_impl_gpu.cuh"
#include "gpu/step_graph.cuh"

namespace k3::gpu {

// The forward step as pieces (step_graph.cuh): host bookkeeping here, device work inside the pieces.
// tok: device token ids [n_tok]; rows: device row indices [n_out] of the logits; z: [n_out, V] device.
Status GpuModel::enqueue(StepRunner& r, const GpuCtx& c, std::span<GpuSeqState* const> states,
                         const int32_t* tok, std::span<const int64_t> row0, const int64_t* rows, int64_t n_out,
                         float* z) {
  const int64_t D = cfg_.d_model, V = cfg_.n_vocab, n_seq = int64_t(states.size()), n_tok = row0.back();
  const ModelWeightsGpu& W = *impl_->w;
  const float eps = cfg_.rms_norm_eps;
  KdaExec kx;
  kx.recurrent = opt_.kda_recurrent;
  kx.chunk = opt_.kda_chunk;
  const bool ar = cfg_.uses_attn_res();
  // Residual-stream buffers, all made before the first piece (the same arena addresses at every step):
  // X[cur] is the running partial sum, X[blk[i]] the finished AttnRes blocks, X[nxt] the next output.
  const int n_blocks = ar ? (cfg_.n_layer + cfg_.attn_res_block_size - 1) / cfg_.attn_res_block_size : 0;
  std::vector<DevBuf> X(size_t(n_blocks + 2));
  DevBuf a, h;
  for (DevBuf& b : X) K3_RETURN_IF_ERROR(b.alloc(c, n_tok * D));
  K3_RETURN_IF_ERROR(a.alloc(c, n_tok * D));
  K3_RETURN_IF_ERROR(h.alloc(c, n_tok * D));
  int cur = 0, nxt = 1;
  std::vector<int> blk;
  auto P = [&](int i) { return X[size_t(i)].f(); };
  // Block AttnRes mix of the finished blocks and the partial sum, as device pointers fixed now.
  auto mix_src = [&] {
    std::vector<const float*> src;
    for (int i : blk) src.push_back(P(i));
    src.push_back(P(cur));
    return src;
  };
  K3_RETURN_IF_ERROR(r.piece(GpuModule::embed, true, [&, p = P(cur)] {
    K3_RETURN_IF_ERROR(embed_gpu(c, W, D, tok, n_tok, p));
    c.cb("embd", -1, p, n_tok * D);
    return ok_status();
  }));
  auto inject = [&](int layer) -> Status {  // set_layer_inputs: the residual stream from outside (eager only)
    const float* hx = inject_ ? inject_(layer, n_tok * D) : nullptr;
    if (hx)
      K3_CUDA_CHECK(cudaMemcpyAsync(P(cur), hx, size_t(n_tok * D) * 4, cudaMemcpyHostToDevice, c.stream()));
    return ok_status();
  };
  // partial sum += o (rounded): its own piece, or owed to the next AttnRes kernel (defer_residual_add)
  const bool defer = defer_residual_add(c, ar, inject_ != nullptr);
  ResidualAdd owed;
  // norm piece: x = AttnRes mix with query q (or the partial sum); h = RMSNorm(x; w)
  auto norm_piece = [&](const float* q, const float* w, const char* name, int l) {
    const bool mixed = ar && q != nullptr;
    return r.piece(
        GpuModule::norm, true,
        [&, src = mix_src(), q, w, name, l, mixed, add = std::exchange(owed, {}), pa = a.f(), ph = h.f()] {
          if (mixed) {
            K3_RETURN_IF_ERROR(attn_res_norm_gpu(c, src, q, eps, n_tok, D, w, pa, ph, add));
          } else {
            if (add.p) add_inplace(c, add.p, add.o, n_tok * D, /*round=*/true);
            rms_norm(c, src.back(), w, eps, n_tok, D, ph);
          }
          c.cb(name, l, ph, n_tok * D);
          return ok_status();
        });
  };
  auto add_piece = [&](const float* o, const char* name, int l) -> Status {
    if (defer) {
      owed = {P(cur), o};
      return ok_status();
    }
    return r.piece(GpuModule::norm, true, [&, p = P(cur), o, name, l] {
      add_inplace(c, p, o, n_tok * D, /*round=*/true);
      if (name) c.cb(name, l, p, n_tok * D);
      return ok_status();
    });
  };
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeightsGpu& lw = W.layers[size_t(l)];
    if (l > 0) K3_RETURN_IF_ERROR(inject(l - 1));
    // attention sub-layer
    const bool fresh = ar && l % cfg_.attn_res_block_size == 0;
    K3_RETURN_IF_ERROR(norm_piece(ar && l > 0 ? lw.q_attn_res : nullptr, lw.input_layernorm, "attn_norm", l));
    std::vector<KdaSeqGpu> kseq(static_cast<size_t>(n_seq));
    std::vector<MlaSeqGpu> mseq(static_cast<size_t>(n_seq));
    for (int64_t i = 0; i < n_seq; ++i) {
      GpuSeqState& st = *states[size_t(i)];
      const int64_t r0 = row0[size_t(i)], n = row0[size_t(i) + 1] - r0;
      kseq[size_t(i)] = {&st.kda[size_t(l)], r0, n};
      const bool absorbed = opt_.mla == MlaPath::absorbed || (opt_.mla == MlaPath::auto_ && n == 1);
      mseq[size_t(i)] = {&st.mla[size_t(l)], r0, n, st.n_past_, absorbed};
    }
    const bool kda = lw.kind == AttnKind::kda;
    // MLA / DSA take the positions (n_past) as host values: eager between the graphs. (Loop locals are
    // captured by value: a failed capture re-runs the pieces later.)
    K3_RETURN_IF_ERROR(r.piece(kda ? GpuModule::kda : GpuModule::mla, kda,
                               [&, pw = &lw, kda, kseq, mseq, l, ph = h.f(), po = P(nxt)] {
                                 if (kda)
                                   K3_RETURN_IF_ERROR(kda_forward_gpu(c, cfg_, pw->kda, kx, kseq, ph, n_tok, po, l));
                                 else
                                   K3_RETURN_IF_ERROR(mla_forward_gpu(c, cfg_, pw->mla, mseq, ph, n_tok, po, l));
                                 c.cb("attn_out", l, po, n_tok * D);
                                 return ok_status();
                               }));
    if (fresh) {  // the partial sum so far becomes a finished block; the new one starts at the attention output
      blk.push_back(cur);
      cur = nxt;
      nxt = int(blk.size()) + 1;
    } else {
      K3_RETURN_IF_ERROR(add_piece(P(nxt), nullptr, l));
    }
    // FFN sub-layer
    K3_RETURN_IF_ERROR(norm_piece(ar ? lw.q_mlp_res : nullptr, lw.post_attention_layernorm, "ffn_norm", l));
    K3_RETURN_IF_ERROR(r.piece(lw.moe ? GpuModule::moe : GpuModule::ffn, true,
                               [&, pw = &lw, l, ph = h.f(), po = P(nxt)] {
                                 if (pw->moe)
                                   K3_RETURN_IF_ERROR(moe_forward_gpu(c, cfg_, pw->moe_w, ph, n_tok, po, l));
                                 else
                                   K3_RETURN_IF_ERROR(ffn_forward_gpu(c, cfg_, pw->mlp, ph, n_tok, po));
                                 c.cb("ffn_out", l, po, n_tok * D);
                                 return ok_status();
                               }));
    K3_RETURN_IF_ERROR(add_piece(P(nxt), "l_out", l));
    if (!c.guard->ok()) return *c.guard;
    K3_RETURN_IF_ERROR(launch_status("layer loop"));
  }
  K3_RETURN_IF_ERROR(inject(cfg_.n_layer - 1));
  // logits = lm_head RMSNorm(h; model.norm), fp32 output, only for the requested rows
  K3_RETURN_IF_ERROR(
      r.piece(GpuModule::norm, true,
              [&, src = mix_src(), add = std::exchange(owed, {}), pa = a.f(), ph = h.f(), po = P(nxt)] {
                const float* fin = src.back();
                if (ar) {
                  K3_RETURN_IF_ERROR(attn_res_mix_gpu(c, src, W.q_out_res, eps, n_tok, D, pa, add));
                  fin = pa;
                }
                gather_rows(c, po, fin, rows, n_out, D);
                rms_norm(c, po, W.norm, eps, n_out, D, ph);
                c.cb("result_norm", cfg_.n_layer, ph, n_out * D);
                return ok_status();
              }));
  if (z)
    K3_RETURN_IF_ERROR(r.piece(GpuModule::lm_head, true, [&, ph = h.f()] {
      linear(c, W.lm_head, ph, n_out, z, /*round=*/false);
      c.cb("result_output", cfg_.n_layer, z, n_out * V);
      return launch_status("logits");
    }));
  return r.finish();
}

void GpuModel::init_ctx(GpuCtx* c, Status* guard) {
  c->prec = opt_.precision;
  c->g = &impl_->ctx.get();
  c->trace = &opt_.trace;
  c->guard = guard;
  c->host = &impl_->host;
  c->side = impl_->side.g ? &impl_->side : nullptr;
  c->stage = &impl_->stage;
}

Status GpuModel::run_pieces(std::span<GpuSeqState* const> states, const int32_t* tokens,
                     std::span<const int64_t> row0, std::span<const int64_t> out_rows, float* logits) {
  const int64_t V = cfg_.n_vocab, n_seq = int64_t(states.size()), n_tok = row0.back();
  K3_CUDA_CHECK(cudaSetDevice(device_));
  for (int64_t i = 0; i < n_seq; ++i)
    K3_RETURN_IF_ERROR(
        states[size_t(i)]->reserve(states[size_t(i)]->n_past_ + row0[size_t(i) + 1] - row0[size_t(i)]));
  Status guard;
  GpuCtx c;
  init_ctx(&c, &guard);
  const int64_t n_out = int64_t(out_rows.size());
  DevBuf tok, rows, z;
  K3_RETURN_IF_ERROR(tok.alloc_bytes(c, size_t(n_tok) * 4));
  K3_RETURN_IF_ERROR(rows.alloc_bytes(c, size_t(n_out) * 8));
  if (logits) K3_RETURN_IF_ERROR(z.alloc(c, n_out * V));
  K3_CUDA_CHECK(cudaMemcpyAsync(tok.f(), tokens, size_t(n_tok) * 4, cudaMemcpyHostToDevice, c.stream()));
  K3_CUDA_CHECK(
      cudaMemcpyAsync(rows.f(), out_rows.data(), size_t(n_out) * 8, cudaMemcpyHostToDevice, c.stream()));
  StepProfile prof;
  StepRunner r(c, profile_ ? StepRunner::Mode::profile : StepRunner::Mode::eager, nullptr, &prof);
  K3_RETURN_IF_ERROR(enqueue(r, c, states, tok.as<int32_t>(), row0, rows.as<int64_t>(), n_out,
                             logits ? z.f() : nullptr));
  if (profile_) *profile_ = prof;
  if (logits)
    K3_CUDA_CHECK(cudaMemcpyAsync(logits, z.f(), size_t(n_out * V) * 4, cudaMemcpyDeviceToHost, c.stream()));
  K3_RETURN_IF_ERROR(synchronize(*c.g));
  K3_RETURN_IF_ERROR(guard);
  for (int64_t i = 0; i < n_seq; ++i) states[size_t(i)]->n_past_ += row0[size_t(i) + 1] - row0[size_t(i)];
  return ok_status();
}

}  // namespace k3::gpu
