// step_graph.cuh: how GpuModel runs the pieces of one forward step: eagerly, eagerly with CUDA events around
// every piece (the per-module time breakdown), or as piecewise CUDA graphs. Internal to src/gpu.
//
//   StepRunner r(c, mode, graphs, profile);
//   r.piece(Module::norm, true, [&] { ...enqueue... return ok_status(); });   // graphable
//   r.piece(Module::mla, false, [&] { ... });   // reads host values that change every step: always eager
//   K3_RETURN_IF_ERROR(r.finish());
//
// A piece only enqueues device work on c.stream (no host reads of device data, no allocation outside
// c.arena, no synchronization); host bookkeeping (which buffer is which) stays outside the pieces, because
// a replayed piece's function is not called. In graph mode the maximal runs of graphable pieces are
// segments: a segment's first occurrence is captured (cudaStreamCaptureModeThreadLocal) into a graph and
// instantiated, later steps replay it with one cudaGraphLaunch. Pieces marked not graphable run eagerly
// between the segments (vLLM's piecewise graphs do the same with attention). A capture that fails (a piece
// that syncs or reads the device on the host, e.g. a host-side MoE dispatch) is not an error: the segment's
// pieces are run eagerly, and next time each of them is tried alone; a piece that fails alone stays eager
// (StepGraphs::eager_reason says why). Segments are keyed by the index of their first piece, so the piece
// sequence must depend only on the config and the batch (the same bucket and states give the same pieces).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpu/common_gpu.cuh"
#include "gpu/model_gpu.h"

namespace k3::gpu {

using Module = GpuModule;             // model_gpu.h
using StepProfile = GpuStepProfile;  // milliseconds per module (CUDA events, one pair per piece)

// The graphs of one batch-size bucket (and one set of sequence states: the captured kernels hold their
// state pointers; a new set clears them).
class StepGraphs {
 public:
  ~StepGraphs() { clear(); }
  void clear();
  std::vector<const void*> key;     // the state pointers the graphs were captured with
  int n_replays = 0, n_captures = 0, n_failed = 0;
  std::string eager_reason;         // why the last capture failed ("" if none did)

 private:
  friend class StepRunner;
  struct Segment {
    int n = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<int, Segment> seg_;      // by first piece index
  std::vector<uint8_t> flags_;      // per piece: 1 = alone in its segment, 2 = always eager
};

class StepRunner {
 public:
  enum class Mode { eager, profile, graph };
  // graph mode: captured pieces take their scratch from `arena` (c.arena is set while they run and their
  // scratch is released after each piece); eager pieces and fallbacks use stream-ordered allocations.
  StepRunner(GpuCtx& c, Mode mode, StepGraphs* graphs, StepProfile* profile, DeviceArena* arena = nullptr);
  ~StepRunner();
  Status piece(Module m, bool graphable, std::function<Status()> fn);
  Status finish();  // closes the last segment; profile mode: waits and fills *profile

 private:
  Status close();
  Status call(const std::function<Status()>& fn, bool captured);
  GpuCtx& c_;
  DeviceArena* arena_;
  Mode mode_;
  StepGraphs* g_;
  StepProfile* prof_;
  int n_ = 0;                  // pieces seen
  bool open_ = false, replay_ = false, failed_ = false;
  int first_ = 0;
  Status fail_;
  std::vector<std::function<Status()>> pending_;  // the open segment's pieces (for the eager fallback)
  std::vector<cudaEvent_t> ev_;                   // profile: 2 per piece
  std::vector<Module> ev_mod_;
};

}  // namespace k3::gpu
