// step_graph.cu: eager / profiled / piecewise-graph execution of a forward step's pieces (step_graph.cuh).
#include "gpu/step_graph.cuh"

namespace k3::gpu {

const char* gpu_module_name(GpuModule m) {
  static const char* names[] = {"embed", "kda", "mla", "moe", "ffn", "norm", "lm_head"};
  return names[int(m)];
}

void StepGraphs::clear() {
  for (auto& [first, s] : seg_)
    if (s.exec) cudaGraphExecDestroy(s.exec);
  seg_.clear();
  flags_.clear();
  key.clear();
}

StepRunner::StepRunner(GpuCtx& c, Mode mode, StepGraphs* graphs, StepProfile* profile, DeviceArena* arena)
    : c_(c), arena_(arena), mode_(mode), g_(graphs), prof_(profile) {
  K3_ASSERT(mode != Mode::graph || graphs != nullptr);
  K3_ASSERT(mode != Mode::profile || profile != nullptr);
}

StepRunner::~StepRunner() {
  if (open_ && !replay_) {  // an early return inside a capture: end it, drop the graph
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(c_.stream(), &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  c_.arena = nullptr;
}

// Runs one piece: captured ones with the arena for scratch (released afterwards: nothing outlives a piece),
// the rest with stream-ordered allocations.
Status StepRunner::call(const std::function<Status()>& fn, bool captured) {
  if (!captured || arena_ == nullptr) {
    c_.arena = nullptr;
    return fn();
  }
  c_.arena = arena_;
  const size_t mark = arena_->used();
  Status s = fn();
  arena_->release(mark);
  c_.arena = nullptr;
  return s;
}

Status StepRunner::piece(Module m, bool graphable, std::function<Status()> fn) {
  const int idx = n_++;
  if (mode_ == Mode::eager) return call(fn, false);
  if (mode_ == Mode::profile) {
    cudaEvent_t a = nullptr, b = nullptr;
    K3_CUDA_CHECK(cudaEventCreate(&a));
    K3_CUDA_CHECK(cudaEventCreate(&b));
    ev_.push_back(a), ev_.push_back(b), ev_mod_.push_back(m);
    K3_CUDA_CHECK(cudaEventRecord(a, c_.stream()));
    K3_RETURN_IF_ERROR(call(fn, false));
    K3_CUDA_CHECK(cudaEventRecord(b, c_.stream()));
    return ok_status();
  }
  if (g_->flags_.size() <= size_t(idx)) g_->flags_.resize(size_t(idx) + 1, 0);
  const uint8_t f = g_->flags_[size_t(idx)];
  if (!graphable || (f & 2)) {
    K3_RETURN_IF_ERROR(close());
    return call(fn, false);
  }
  if (open_ && ((f & 1) || (g_->flags_[size_t(first_)] & 1))) K3_RETURN_IF_ERROR(close());
  if (!open_) {
    open_ = true, first_ = idx, failed_ = false, fail_ = ok_status();
    pending_.clear();
    auto it = g_->seg_.find(idx);
    replay_ = it != g_->seg_.end();
    if (!replay_) {
      const cudaError_t e = cudaStreamBeginCapture(c_.stream(), cudaStreamCaptureModeThreadLocal);
      if (e != cudaSuccess) {
        cudaGetLastError();
        open_ = false;
        g_->flags_[size_t(idx)] |= 2;
        g_->eager_reason = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
        return call(fn, false);
      }
    }
  }
  if (replay_) return ok_status();
  pending_.push_back(fn);
  if (!failed_) {  // after a failure the capture is invalid: later pieces run in the eager fallback only
    Status s = call(fn, true);
    if (!s.ok()) failed_ = true, fail_ = s;
  }
  return ok_status();
}

Status StepRunner::close() {
  if (!open_) return ok_status();
  open_ = false;
  if (replay_) {
    const StepGraphs::Segment& s = g_->seg_.at(first_);
    K3_CUDA_CHECK(cudaGraphLaunch(s.exec, c_.stream()));
    ++g_->n_replays;
    return ok_status();
  }
  const int n_seg = int(pending_.size());
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(c_.stream(), &graph);
  cudaGraphExec_t exec = nullptr;
  if (!failed_ && e == cudaSuccess && graph) {
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) exec = nullptr;
  }
  if (graph) cudaGraphDestroy(graph);
  if (exec) {
    g_->seg_[first_] = {n_seg, exec};
    ++g_->n_captures;
    K3_CUDA_CHECK(cudaGraphLaunch(exec, c_.stream()));
    return ok_status();
  }
  // The capture failed: remember why, split the segment (or keep a lone piece eager), run it eagerly now.
  cudaGetLastError();
  ++g_->n_failed;
  g_->eager_reason = !fail_.ok() ? fail_.message()
                                 : std::string("stream capture: ") + cudaGetErrorString(e);
  for (int i = first_; i < first_ + n_seg; ++i) g_->flags_[size_t(i)] |= n_seg > 1 ? 1 : 2;
  std::vector<std::function<Status()>> run = std::move(pending_);
  pending_.clear();
  for (auto& fn : run) K3_RETURN_IF_ERROR(call(fn, false));
  return ok_status();
}

Status StepRunner::finish() {
  K3_RETURN_IF_ERROR(close());
  if (mode_ != Mode::profile) return ok_status();
  K3_CUDA_CHECK(cudaStreamSynchronize(c_.stream()));
  *prof_ = StepProfile{};
  for (size_t i = 0; i < ev_mod_.size(); ++i) {
    float ms = 0.f;
    K3_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[2 * i], ev_[2 * i + 1]));
    prof_->ms[int(ev_mod_[i])] += ms;
  }
  if (!ev_.empty()) K3_CUDA_CHECK(cudaEventElapsedTime(&prof_->total_ms, ev_.front(), ev_.back()));
  prof_->n_pieces = int(ev_mod_.size());
  return ok_status();
}

}  // namespace k3::gpu
