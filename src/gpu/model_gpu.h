// model_gpu.h: the forward pass of Kimi Linear, K3 and K3.1 on one CUDA device, the twin of model/model.h.
//
//   x0 = embed_tokens[id];  per layer the same sub-layers as the CPU model (KDA | MLA | DSA, then dense GLU |
//   MoE), residual adds (KL) or Block AttnRes (K3 / K3.1);  logits = lm_head RMSNorm(final; model.norm)
//
// Every block mirrors src/model/<block>.cpp: same equations, same bf16 rounding points, same named
// intermediates (ModelOptions::trace receives host copies), so GPU = CPU is checked tensor by tensor
// (tests/cpp/test_gpu_model.cpp). Activations are fp32 on the device; fp32 mode never uses TF32.
// Weights are uploaded once from the CPU binding (weights_gpu.h); per-sequence state (KDA S and conv
// window, MLA latent cache, DSA index keys) lives on the device in a GpuSeqState.
//
// Built without CUDA (or with no device), load() returns Code::unsupported with "built without CUDA" /
// "no CUDA device". This header includes no CUDA headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "k3/config.h"
#include "model/model.h"
#include "model/state.h"

namespace k3::gpu {

struct ModelWeightsGpu;
struct GpuCtx;
class GpuModel;
class StepRunner;

// Per-module device time of one forward call (GpuModel::set_profile): CUDA events around every piece of
// the step (step_graph.cuh), summed by module. "norm" holds the RMSNorms, residual adds and Block AttnRes.
enum class GpuModule : int { embed, kda, mla, moe, ffn, norm, lm_head, count };
const char* gpu_module_name(GpuModule m);
struct GpuStepProfile {
  float ms[int(GpuModule::count)] = {};
  float total_ms = 0.f;  // first piece's start to last piece's end
  int n_pieces = 0;
};
// CUDA-graph decode steps so far (ModelOptions::cuda_graph).
struct GpuGraphStats {
  int graph_steps = 0, eager_steps = 0;  // decode steps run with graphs / without (first of a bucket, ...)
  int captures = 0, replays = 0, failed = 0;  // graph segments captured, replayed, failed to capture
  std::string eager_reason;                   // why the last failed capture failed
};

struct KdaStateGpu {
  float* S = nullptr;          // [H, K, V] fp32
  float* conv = nullptr;       // [3, W-1, H*K] pre-conv q~, k~, v~ rows, oldest first (generic kernels)
  uint16_t* conv16 = nullptr;  // instead of conv on the fast path (bf16 mode, K = V = 128, W = 4): the same
                               // window in bf16, exact (the pre-conv rows are a bf16 rounding point)
};
struct CachePagesGpu;
class CachePoolGpu;
struct MlaStateGpu {
  float* latent = nullptr;   // [cap, d_latent] rows [c | r]; rows [0, n_past) valid
  float* index_k = nullptr;  // [cap, dsa d_head] (DSA layers)
  int64_t cap = 0;           // rows allocated
  // The same rows in bf16 pages of the model's pool (cache_pool_gpu.cuh), which the tensor-core MLA and DSA
  // kernels read: this layer's arrays, and the sequence's page ids (position s in page (*table)[s / 64]).
  // Null where the config's shapes have no pages.
  const CachePagesGpu* paged = nullptr;
  const std::vector<int32_t>* table = nullptr;
};

// Per-sequence state on the device (model/state.h's layout, device memory).
class GpuSeqState {
 public:
  ~GpuSeqState();
  GpuSeqState(const GpuSeqState&) = delete;
  GpuSeqState& operator=(const GpuSeqState&) = delete;

  int64_t n_past() const { return n_past_; }
  // Back to an empty sequence (S and conv windows zeroed, caches emptied; capacity kept).
  Status reset();
  // Device -> host copy into a CPU state of the same config (then the CPU model can continue it), and back.
  Status download(SeqState* host) const;
  Status upload(const SeqState& host);
  // Device bytes held.
  int64_t bytes() const;

  std::vector<KdaStateGpu> kda;  // [n_layer]; null for MLA layers
  std::vector<MlaStateGpu> mla;  // [n_layer]; null for KDA layers

 private:
  friend class GpuModel;
  explicit GpuSeqState(const ModelConfig& cfg) : cfg_(&cfg) {}
  // Grows every MLA layer's cache to hold at least n rows (doubling; old rows copied), and takes the pages
  // for them.
  Status reserve(int64_t n);
  // Pages <- bf16 of the fp32 rows [0, n) of every MLA layer (after upload and fill_synthetic).
  Status store_pages(int64_t n);
  const ModelConfig* cfg_;
  float* kda_block_ = nullptr;  // one allocation for every KDA layer's S and conv
  std::shared_ptr<CachePoolGpu> pool_;  // the model's page pool (null: no pages for this config)
  std::vector<int32_t> pages_;          // page ids, in position order; the same in every MLA layer
  int64_t n_past_ = 0;
};

class GpuModel {
 public:
  // Binds the checkpoint (model/weights.h, same names and checks as the CPU) and uploads it to `device`.
  static Result<std::unique_ptr<GpuModel>> load(const Checkpoint& ckpt, const ModelOptions& opt,
                                                int device = 0);
  ~GpuModel();

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  size_t weight_bytes() const;
  Result<std::unique_ptr<GpuSeqState>> new_state();

  // As Model::forward: appends tokens, logits [n_tok or 1, n_vocab] on the host. A bad token id gives a
  // Status and leaves the state unchanged.
  Status forward(GpuSeqState& state, const int32_t* tokens, int64_t n_tok, std::vector<float>* logits,
                 bool all_logits);
  // As Model::forward_batch: several sequences in one call; last_logits[i]: [n_vocab].
  Status forward_batch(std::span<GpuSeqState*> states, std::span<const std::span<const int32_t>> tokens,
                       std::vector<std::vector<float>>* last_logits);

  // Test hook (layer-by-layer comparison): before layer l > 0, and before the final norm (l = n_layer), the
  // residual stream is replaced by fn(l - 1, n) when it returns non-null: a host array of n = n_tok * d_model
  // floats (e.g. the CPU's traced "l_out" of layer l - 1). In bf16 mode rounding flips compound with depth
  // (CPU against CPU with another summation order drifts to ~1e-4 NMSE by layer 6 of tiny-k3), so blocks are
  // compared on identical inputs. Null fn (the default): no injection.
  using LayerInputFn = std::function<const float*(int layer, int64_t n)>;
  void set_layer_inputs(LayerInputFn fn) { inject_ = std::move(fn); }

  // Opt-in (ModelOptions::cuda_graph, K3_CUDA_GRAPH=1, k3 --cuda-graph; run on GPUs since session 4,
  // docs/cuda.md): decode steps (every sequence of the call adds one token; no trace, no layer inputs, at
  // most 64 sequences) run as CUDA graphs: the batch is padded to a bucket (1, 2, 4, 8, 16, 32, 64) with
  // scratch sequences, the step's pieces run in piecewise graphs captured at the bucket's second step (the
  // first runs eagerly: it warms up cuBLAS and the kernels' lazy set-up) and replayed after that with only
  // the token ids copied in; the MLA / DSA attention sub-layers run eagerly between the graphs because their
  // kernels take the positions as host values (step_graph.cuh). Scratch comes from one device arena sized for
  // the largest bucket. Results equal the eager run bit for bit.
  void set_cuda_graph(bool on) { graphs_on_ = on; }
  // Benchmark / check hooks on a loaded model (the uploaded weights do not depend on either).
  void set_precision(Precision p) { opt_.precision = p; }
  void set_trace(std::function<void(const char*, int, const float*, int64_t)> fn) { opt_.trace = std::move(fn); }
  GpuGraphStats graph_stats() const;
  // Benchmark hook: while set, every call runs eagerly with CUDA events around each piece and *p receives
  // the last call's per-module times. Null: off.
  void set_profile(GpuStepProfile* p) { profile_ = p; }

  // Benchmark hook: makes `st` a sequence of n_past tokens without a prefill: random KDA states and conv
  // windows, random latent / index-key cache rows (O(1) values, bf16-representable), capacity for
  // n_past + headroom rows. The numbers are meaningless; the bytes and shapes are those of a real context.
  Status fill_synthetic(GpuSeqState& st, int64_t n_past, uint64_t seed, int64_t headroom = 64);

 private:
  struct Impl;
  GpuModel(const ModelConfig& cfg, const ModelOptions& opt);
  Status run(std::span<GpuSeqState* const> states, const int32_t* tokens, std::span<const int64_t> row0,
             std::span<const int64_t> out_rows, float* logits);
  // run's loop as pieces (model_step_gpu.cu), eagerly with CUDA events: used while set_profile is on.
  Status run_pieces(std::span<GpuSeqState* const> states, const int32_t* tokens, std::span<const int64_t> row0,
                    std::span<const int64_t> out_rows, float* logits);
  // One decode step of n = states.size() sequences as CUDA graphs (see set_cuda_graph); logits [n, n_vocab]
  // (nullptr: they stay in the pinned staging buffer Impl::z_h until the next step).
  Status run_graph_step(std::span<GpuSeqState* const> states, const int32_t* tokens, float* logits);
  bool graph_step_ok(size_t n_seq) const;
  // The layer loop as pieces (step_graph.cuh): tok [n_tok] and rows [n_out] device arrays, z [n_out, V].
  Status enqueue(StepRunner& r, const GpuCtx& c, std::span<GpuSeqState* const> states, const int32_t* tok,
                 std::span<const int64_t> row0, const int64_t* rows, int64_t n_out, float* z);
  void init_ctx(GpuCtx* c, Status* guard);
  const ModelConfig& cfg_;
  ModelOptions opt_;
  int device_ = 0;
  LayerInputFn inject_;
  bool graphs_on_ = true;
  GpuStepProfile* profile_ = nullptr;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::gpu
