// model_graph_gpu.cu: GpuModel's CUDA-graph decode steps (model_gpu.h set_cuda_graph; the pieces and their
// graphs: step_graph.cuh) and synthetic contexts for benchmarks (fill_synthetic).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "gpu/blocks_gpu.cuh"
#include "gpu/model_impl_gpu.cuh"

namespace k3::gpu {

namespace {

// Synthetic context (fill_synthetic): x[i] = lo + (hi - lo) u(seed, i), u a hash in [0, 1), bf16-rounded.
// bf16_out: x holds bf16 (uint16) elements.
__global__ void fill_uniform_kernel(float* x, int64_t n, uint64_t seed, float lo, float hi, bool bf16_out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float v = round_bf16_dev(lo + (hi - lo) * float(z >> 40) * (1.f / 16777216.f));
  if (bf16_out)
    reinterpret_cast<uint16_t*>(x)[i] = uint16_t(__float_as_uint(v) >> 16);
  else
    x[i] = v;
}

}  // namespace

bool GpuModel::graph_step_ok(size_t n_seq) const {
  return graphs_on_ && !opt_.trace && !inject_ && !profile_ && n_seq >= 1 &&
         n_seq <= size_t(kBuckets[kNumBuckets - 1]);
}

GpuGraphStats GpuModel::graph_stats() const {
  GpuGraphStats s = impl_->stats;
  for (const StepGraphs& g : impl_->graphs) {
    s.captures += g.n_captures, s.replays += g.n_replays, s.failed += g.n_failed;
    if (!g.eager_reason.empty()) s.eager_reason = g.eager_reason;
  }
  return s;
}

// Arena bytes for a graph step of B rows: the step's buffers plus a generous bound on the captured pieces'
// scratch (context-independent: MLA / DSA, whose scratch grows with the context, run outside the graphs).
static size_t graph_arena_bytes(const ModelConfig& c, int B) {
  const int64_t n_blocks = c.uses_attn_res() ? (c.n_layer + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
  const int64_t hk = int64_t(c.kda.n_head) * c.kda.d_head;
  const int64_t moe = int64_t(std::max(c.moe.n_expert_used, 1)) *
                          (3 * int64_t(c.moe.d_ff_expert) + 2 * int64_t(std::max(c.moe.d_latent, c.d_model))) +
                      4 * int64_t(c.moe.n_shared_expert) * c.moe.d_ff_expert;
  const int64_t scratch = std::max({int64_t(4) * c.d_ff, 12 * hk, 2 * moe, int64_t(4) * c.moe.n_expert,
                                    int64_t(16) * c.d_model});
  const int64_t per_tok = (n_blocks + 6) * c.d_model + c.n_vocab + 2 * scratch + 64;
  return (size_t(64) << 20) + size_t(B) * size_t(per_tok) * 4;
}

Status GpuModel::run_graph_step(std::span<GpuSeqState* const> states, const int32_t* tokens, float* logits) {
  Impl& m = *impl_;
  const int n = int(states.size());
  int bi = 0;
  while (kBuckets[bi] < n) ++bi;
  const int B = kBuckets[bi];
  const int64_t V = cfg_.n_vocab;
  K3_CUDA_CHECK(cudaSetDevice(device_));
  while (int(m.pads.size()) < B - n) {
    K3_ASSIGN_OR_RETURN(auto st, new_state());
    m.pads.push_back(std::move(st));
  }
  std::vector<GpuSeqState*> all(states.begin(), states.end());
  for (int i = n; i < B; ++i) {
    m.pads[size_t(i - n)]->n_past_ = 0;  // a scratch row 0, overwritten every step
    all.push_back(m.pads[size_t(i - n)].get());
  }
  for (GpuSeqState* st : all) K3_RETURN_IF_ERROR(st->reserve(st->n_past_ + 1));  // outside any capture
  if (m.arena_bucket < B) {  // a larger bucket: new arena and staging (every graph held old addresses)
    for (StepGraphs& g : m.graphs) g.clear();
    for (int& s : m.steps) s = 0;
    K3_RETURN_IF_ERROR(synchronize(m.ctx.get()));
    m.arena.destroy();
    K3_RETURN_IF_ERROR(m.arena.init(graph_arena_bytes(cfg_, B), "CUDA-graph step arena"));
    cudaFreeHost(m.tok_h), cudaFreeHost(m.rows_h), cudaFreeHost(m.z_h);
    m.tok_h = nullptr, m.rows_h = nullptr, m.z_h = nullptr;
    K3_CUDA_CHECK(cudaMallocHost(&m.tok_h, size_t(B) * 4));
    K3_CUDA_CHECK(cudaMallocHost(&m.rows_h, size_t(B) * 8));
    K3_CUDA_CHECK(cudaMallocHost(&m.z_h, size_t(B) * size_t(V) * 4));
    m.arena_bucket = B;
  }
  StepGraphs& graphs = m.graphs[bi];
  std::vector<const void*> key;  // the device pointers the captured pieces hold: every KDA state
  for (GpuSeqState* st : all)
    for (const KdaStateGpu& k : st->kda) key.push_back(k.S), key.push_back(k.conv), key.push_back(k.conv16);
  if (graphs.key != key) {  // other sequences: the captured KDA pieces hold their state pointers
    graphs.clear();
    graphs.key = key;
  }
  Status guard;
  GpuCtx c;
  init_ctx(&c, &guard);
  m.arena.reset();
  c.arena = &m.arena;
  DevBuf tok, rows, z;  // first in the arena: the same addresses at every step
  K3_RETURN_IF_ERROR(tok.alloc_bytes(c, size_t(B) * 4));
  K3_RETURN_IF_ERROR(rows.alloc_bytes(c, size_t(B) * 8));
  K3_RETURN_IF_ERROR(z.alloc(c, B * V));
  for (int i = 0; i < B; ++i) m.tok_h[i] = i < n ? tokens[i] : 0, m.rows_h[i] = i;
  K3_CUDA_CHECK(cudaMemcpyAsync(tok.f(), m.tok_h, size_t(B) * 4, cudaMemcpyHostToDevice, c.stream()));
  K3_CUDA_CHECK(cudaMemcpyAsync(rows.f(), m.rows_h, size_t(B) * 8, cudaMemcpyHostToDevice, c.stream()));
  std::vector<int64_t> row0(size_t(B) + 1);
  for (int i = 0; i <= B; ++i) row0[size_t(i)] = i;
  // The bucket's first step runs eagerly (cuBLAS and lazy kernel set-up happen outside a capture).
  const bool warm = m.steps[bi] > 0;
  {
    StepRunner r(c, warm ? StepRunner::Mode::graph : StepRunner::Mode::eager, &graphs, nullptr, &m.arena);
    K3_RETURN_IF_ERROR(enqueue(r, c, all, tok.as<int32_t>(), row0, rows.as<int64_t>(), B, z.f()));
  }
  K3_CUDA_CHECK(cudaMemcpyAsync(m.z_h, z.f(), size_t(n) * size_t(V) * 4, cudaMemcpyDeviceToHost, c.stream()));
  K3_RETURN_IF_ERROR(synchronize(*c.g));
  K3_RETURN_IF_ERROR(guard);
  if (logits) std::copy(m.z_h, m.z_h + size_t(n) * size_t(V), logits);
  for (GpuSeqState* st : states) st->n_past_ += 1;
  ++m.steps[bi];
  ++(warm ? m.stats.graph_steps : m.stats.eager_steps);
  return ok_status();
}

Status GpuModel::fill_synthetic(GpuSeqState& st, int64_t n_past, uint64_t seed, int64_t headroom) {
  if (n_past < 0 || headroom < 0) return error(Code::invalid_argument, "fill_synthetic: negative length");
  K3_CUDA_CHECK(cudaSetDevice(device_));
  K3_RETURN_IF_ERROR(st.reset());
  K3_RETURN_IF_ERROR(st.reserve(n_past + headroom));
  cudaStream_t s = impl_->ctx.get().stream;
  auto fill = [&](void* x, int64_t n, float lo, float hi, bool bf16_out = false) {
    if (x && n > 0)
      fill_uniform_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(x), n,
                                                             seed++ * 0x5851F42D4C957F2Dull, lo, hi, bf16_out);
  };
  const KdaConfig& k = cfg_.kda;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.layer_attn[size_t(l)] == AttnKind::kda) {  // S: small entries; conv window: O(1) pre-conv rows
      fill(st.kda[size_t(l)].S, int64_t(k.n_head) * k.d_head * k.d_head, -0.05f, 0.05f);
      const int64_t n_conv = 3 * int64_t(k.conv_size - 1) * k.n_head * k.d_head;
      fill(st.kda[size_t(l)].conv, n_conv, -1.f, 1.f);
      fill(st.kda[size_t(l)].conv16, n_conv, -1.f, 1.f, true);
      continue;
    }
    const MlaStateGpu& m = st.mla[size_t(l)];
    fill(m.latent, n_past * cfg_.mla.d_latent(), -1.f, 1.f);
    if (cfg_.layer_attn[size_t(l)] == AttnKind::dsa) fill(m.index_k, n_past * cfg_.dsa.d_head, -1.f, 1.f);
  }
  K3_RETURN_IF_ERROR(launch_status("fill_synthetic"));
  K3_RETURN_IF_ERROR(synchronize(impl_->ctx.get()));
  K3_RETURN_IF_ERROR(st.store_pages(n_past));
  st.n_past_ = n_past;
  return ok_status();
}

}  // namespace k3::gpu
