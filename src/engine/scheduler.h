// scheduler.h: continuous batching with chunked prefill under a per-step token budget (docs/cache.md).
//
// One step():
//   1. cancelled requests end (pages released, on_done(aborted));
//   2. admission: while running < max_running, the next waiting request (short prompts before long ones)
//      starts: the backend restores its cached prefix; no room -> it waits;
//   3. decode: every request in the decode phase feeds its pending id, in one batched call (1 token each);
//   4. prefill: the rest of the budget goes to prefill chunks, short prompts first; long prompts
//      (>= long_prompt ids) get at most long_step_tokens per step, so a short request admitted while a
//      very long one runs still gets its first token within a step or two (seed 004 §11.3);
//   5. out_of_memory from the backend preempts the most recently admitted other request (recompute: its
//      pages are released and it re-prefills prompt ++ generated later); alone, the request fails;
//   6. sampling, stop ids, max_new / context -> on_token / on_done; backend.end_step().
// submit() is thread-safe and refuses (returns false) when max_queue requests already wait (-> HTTP 429).
// Everything else runs on the one thread that calls step().
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/request.h"

namespace k3 {

// What the scheduler needs from a model + cache (ModelBackend, or a fake in tests).
class StepBackend {
 public:
  virtual ~StepBackend() = default;
  virtual int32_t n_vocab() const = 0;
  // A fresh state for r, with the cached prefix of r.tokens[0, n_prefill) restored: the ids restored.
  virtual Result<int64_t> start(Request& r) = 0;
  // Feeds ids after r's state; r.logits = the last position's logits.
  virtual Status prefill(Request& r, std::span<const int32_t> ids) = 0;
  // One id per request (its pending one); each r.logits updated. On failure *failed = the index at fault.
  virtual Status decode(std::span<Request*> rs, int* failed) = 0;
  // r leaves (finished: keep its last checkpoint as a turn boundary).
  virtual void stop(Request& r, bool finished) = 0;
  virtual void end_step(std::span<Request*> running) = 0;
};

struct SchedulerOptions {
  int max_running = 4;
  int max_queue = 64;
  int step_tokens = 256;      // tokens fed per step (decode ids + prefill chunks)
  int long_prompt = 1024;     // a prompt this long or longer is "long"
  int long_step_tokens = 64;  // prefill tokens a long prompt may use per step
};

struct SchedulerStats {
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, preemptions = 0, finished = 0, rejected = 0;
};

class Scheduler {
 public:
  Scheduler(StepBackend& backend, const SchedulerOptions& opt) : be_(backend), opt_(opt) {}

  // Thread-safe. False when the queue is full (the request is not taken).
  bool submit(std::shared_ptr<Request> r);
  // One step; false when there was nothing to do.
  bool step();
  bool idle();
  // Marks every queued and running request cancelled (they end at the next step). Scheduler thread.
  void cancel_all();
  int n_running() const { return int(running_.size()); }
  int n_waiting();
  const SchedulerStats& stats() const { return stats_; }

 private:
  void take_incoming();
  void admit();
  void finish(Request& r, FinishReason why, const Status& err, bool keep);
  void preempt(Request& r);
  bool make_room(const Request& keep);
  void sample(Request& r);
  void run_prefill(int budget);

  StepBackend& be_;
  SchedulerOptions opt_;
  std::mutex mu_;
  std::deque<std::shared_ptr<Request>> incoming_;  // guarded by mu_
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<std::shared_ptr<Request>> running_;  // admission order
  uint64_t next_id_ = 1;
  std::atomic<size_t> n_waiting_{0};  // waiting_.size(), readable by submit()
  SchedulerStats stats_;
};

}  // namespace k3
