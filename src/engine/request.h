// request.h: one generation request as the scheduler sees it (scheduler.h).
//
//   tokens = prompt ++ generated                       all ids of the sequence
//   n_fed                                              ids the backend's state holds
//   prefill phase: feed tokens[n_fed, n_prefill) in chunks; then sample (unless resuming after a preemption)
//   decode phase:  the last generated id is pending; feed it, sample the next
// Callbacks run on the scheduler thread. on_token returns false to cancel; `cancelled` may be set from
// any thread (a client that went away) and is honoured at the next step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/prefix_index.h"
#include "core/status.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "model/state.h"

namespace k3 {

struct Request {
  // ---- set by the submitter ----
  std::vector<int32_t> prompt;
  int max_new = 16;      // generated ids at most (stop ids not counted)
  int64_t n_ctx = 4096;  // prompt + generated must stay below this
  SamplerParams sampling;
  std::vector<int32_t> stop_ids;
  std::function<bool(int32_t id, const SampleResult& s)> on_token;
  // Exactly once: stop | length | aborted (cancelled, or failed with `error` non-ok).
  std::function<void(FinishReason reason, const Status& error)> on_done;
  std::atomic<bool> cancelled{false};

  // ---- scheduler state ----
  uint64_t id = 0;
  enum class Phase { waiting, prefill, decode, done } phase = Phase::waiting;
  std::vector<int32_t> tokens;  // prompt ++ generated
  int n_generated = 0;
  int64_t n_fed = 0, n_prefill = 0;
  bool resume_decode = false;  // re-prefilled after a preemption: the pending id is known
  int64_t n_cached = 0;        // prompt ids restored from the prefix cache (first admission)
  int n_preempted = 0;
  int64_t admitted_step = -1, first_token_step = -1;
  std::unique_ptr<SeqState> state;
  SeqCache cache_seq;
  std::unique_ptr<Sampler> sampler;
  std::vector<float> logits;  // [n_vocab] of the last fed position
  bool is_long = false;
};

}  // namespace k3
