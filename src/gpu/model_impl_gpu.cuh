// model_impl_gpu.cuh: GpuModel's private state (model_gpu.h), shared by model_gpu.cu (load, the layer loop,
// eager calls) and model_graph_gpu.cu (CUDA-graph decode steps, synthetic contexts). Internal to src/gpu.
#pragma once

#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "gpu/arena.h"
#include "gpu/cache_pool_gpu.cuh"
#include "gpu/context.h"
#include "gpu/model_gpu.h"
#include "gpu/step_graph.cuh"
#include "gpu/weights_gpu.h"

namespace k3::gpu {

constexpr int kBuckets[] = {1, 2, 4, 8, 16, 32, 64};  // decode batch sizes with their own graphs
constexpr int kNumBuckets = int(sizeof kBuckets / sizeof kBuckets[0]);

struct GpuModel::Impl {
  ContextOwner ctx;
  // The shared experts' stream beside ctx's (K3_MOE_OVERLAP, model_gpu.cu load): its own cuBLAS handles and
  // workspace, so any op may run there.
  ContextOwner side_ctx;
  SideStream side;  // side.g == nullptr: no side stream
  std::unique_ptr<ModelWeightsGpu> w;
  std::vector<float> host;    // trace staging
  HostStage stage;            // pinned slots for the MLA layers' block tables (GpuCtx::stage)
  std::shared_ptr<CachePoolGpu> pool;  // the bf16 cache pages of every sequence (made by the first new_state)
  std::vector<float> logits;  // forward_batch's [B, V] host logits, grown, never shrunk
  std::unique_ptr<ThreadPool> copy_pool;  // hands the logits rows out (forward_batch, large batches)
  // CUDA-graph decode steps (run_graph_step)
  DeviceArena arena;          // every graph step's buffers and captured scratch; sized for arena_bucket
  int arena_bucket = 0;
  StepGraphs graphs[kNumBuckets];
  int steps[kNumBuckets] = {};  // steps run per bucket (the first one runs eagerly)
  std::vector<std::unique_ptr<GpuSeqState>> pads;  // scratch sequences padding a batch to its bucket
  int32_t* tok_h = nullptr;  // pinned staging: token ids [bucket], row indices [bucket], logits
  int64_t* rows_h = nullptr;
  float* z_h = nullptr;
  GpuGraphStats stats;
  ~Impl() {
    cudaFreeHost(tok_h), cudaFreeHost(rows_h), cudaFreeHost(z_h);
    if (side.fork) cudaEventDestroy(side.fork);
    if (side.join) cudaEventDestroy(side.join);
  }
};

// Whether a sub-layer's residual add may be owed to the next AttnRes kernel (ResidualAdd, blocks_gpu.cuh)
// instead of running as its own kernel: yes unless something must see the sum at its own time, a trace hook
// ("l_out") or a debug build's NaN checks, or set_layer_inputs (which overwrites it). K3_FUSE_ADD=0: never.
bool defer_residual_add(const GpuCtx& c, bool attn_res, bool injecting);

}  // namespace k3::gpu
