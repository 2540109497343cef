// Scheduler on a fake backend (deterministic steps, no model): continuous batching, chunked prefill under
// the step budget, short requests' first token while a long prompt runs, the queue limit, preemption by
// recompute when the "pool" runs out, and cancellation.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "engine/scheduler.h"

namespace k3 {
namespace {

constexpr int32_t kVocab = 50;
int32_t next_of(int32_t last) {
  return (last * 7 + 3) % kVocab;
}

// Logits: one-hot at next_of(last fed id). Holds at most `capacity` fed ids over all live sequences.
class FakeBackend : public StepBackend {
 public:
  int64_t capacity = 1 << 30;
  std::map<const Request*, int64_t> held;  // fed ids per live request
  std::vector<int64_t> prefill_sizes;
  int32_t n_vocab() const override { return kVocab; }
  int64_t used() const {
    int64_t n = 0;
    for (auto& [r, k] : held) n += k;
    return n;
  }
  Result<int64_t> start(Request& r) override {
    held[&r] = 0;
    return int64_t(0);
  }
  Status prefill(Request& r, std::span<const int32_t> ids) override {
    if (used() + int64_t(ids.size()) > capacity) return error(Code::out_of_memory, "fake pool full");
    held[&r] += int64_t(ids.size());
    prefill_sizes.push_back(int64_t(ids.size()));
    set_logits(r, ids.back());
    return ok_status();
  }
  Status decode(std::span<Request*> rs, int* failed) override {
    if (used() + int64_t(rs.size()) > capacity) {
      *failed = int(rs.size()) - 1;
      return error(Code::out_of_memory, "fake pool full");
    }
    for (Request* r : rs) held[r] += 1, set_logits(*r, r->tokens.back());
    return ok_status();
  }
  void stop(Request& r, bool) override { held.erase(&r); }
  void end_step(std::span<Request*>) override {}

 private:
  static void set_logits(Request& r, int32_t last) {
    r.logits.assign(kVocab, 0.f);
    r.logits[size_t(next_of(last))] = 1.f;
  }
};

struct Out {
  std::vector<int32_t> ids;
  FinishReason why = FinishReason::aborted;
  bool done = false;
};

std::shared_ptr<Request> make(int n_prompt, int max_new, Out* out, int32_t seed = 1) {
  auto r = std::make_shared<Request>();
  for (int i = 0; i < n_prompt; ++i) r->prompt.push_back((seed + i) % kVocab);
  r->max_new = max_new;
  r->sampling.temperature = 0;
  r->on_token = [out](int32_t id, const SampleResult&) {
    out->ids.push_back(id);
    return true;
  };
  r->on_done = [out](FinishReason why, const Status&) { out->why = why, out->done = true; };
  return r;
}

std::vector<int32_t> expected(int n_prompt, int max_new, int32_t seed = 1) {
  std::vector<int32_t> v;
  int32_t last = (seed + n_prompt - 1) % kVocab;
  for (int i = 0; i < max_new; ++i) v.push_back(last = next_of(last));
  return v;
}

void run_all(Scheduler& s, int max_steps = 1000) {
  for (int i = 0; i < max_steps && s.step(); ++i) {
  }
}

TEST(Scheduler, ContinuousBatchingFinishesEveryRequest) {
  FakeBackend be;
  SchedulerOptions o;
  o.max_running = 2;
  Scheduler s(be, o);
  std::vector<Out> outs(6);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.submit(make(5 + i, 4 + i, &outs[size_t(i)], i)));
  run_all(s);
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(outs[size_t(i)].done);
    EXPECT_EQ(outs[size_t(i)].why, FinishReason::length);
    EXPECT_EQ(outs[size_t(i)].ids, expected(5 + i, 4 + i, i));
  }
  EXPECT_TRUE(s.idle());
  EXPECT_TRUE(be.held.empty());
}

TEST(Scheduler, ChunkedPrefillStaysUnderTheStepBudget) {
  FakeBackend be;
  SchedulerOptions o;
  o.step_tokens = 32;
  Scheduler s(be, o);
  Out out;
  auto r = make(100, 3, &out);
  ASSERT_TRUE(s.submit(r));
  run_all(s);
  EXPECT_EQ(be.prefill_sizes, (std::vector<int64_t>{32, 32, 32, 4}));
  EXPECT_EQ(r->first_token_step, 3);
  EXPECT_EQ(out.ids, expected(100, 3));
}

TEST(Scheduler, StopIdEndsWithStop) {
  FakeBackend be;
  Scheduler s(be, {});
  Out out;
  auto r = make(4, 10, &out);
  r->stop_ids = {expected(4, 3)[2]};
  ASSERT_TRUE(s.submit(r));
  run_all(s);
  EXPECT_EQ(out.why, FinishReason::stop);
  EXPECT_EQ(out.ids, expected(4, 2));  // the stop id is not emitted
}

TEST(Scheduler, ShortRequestGetsItsFirstTokenWhileALongPromptRuns) {
  FakeBackend be;
  SchedulerOptions o;
  o.step_tokens = 256, o.long_prompt = 1024, o.long_step_tokens = 64;
  Scheduler s(be, o);
  Out long_out, short_out;
  auto lr = make(4000, 2, &long_out);
  ASSERT_TRUE(s.submit(lr));
  for (int i = 0; i < 3; ++i) s.step();
  EXPECT_EQ(lr->n_fed, 3 * 64);  // a long prompt never takes more than its share of a step
  auto sr = make(100, 2, &short_out, 5);
  ASSERT_TRUE(s.submit(sr));
  s.step();
  EXPECT_EQ(sr->first_token_step, 3);  // the same step it arrived in
  EXPECT_EQ(lr->n_fed, 4 * 64);        // and the long one kept going
  run_all(s);
  EXPECT_EQ(long_out.ids, expected(4000, 2));
  EXPECT_EQ(short_out.ids, expected(100, 2, 5));
}

TEST(Scheduler, QueueLimitRefuses) {
  FakeBackend be;
  SchedulerOptions o;
  o.max_queue = 2;
  Scheduler s(be, o);
  Out a, b, c;
  EXPECT_TRUE(s.submit(make(3, 1, &a)));
  EXPECT_TRUE(s.submit(make(3, 1, &b)));
  EXPECT_FALSE(s.submit(make(3, 1, &c)));
  EXPECT_EQ(s.stats().rejected, 1);
  run_all(s);
  EXPECT_TRUE(a.done && b.done);
  EXPECT_FALSE(c.done);
}

TEST(Scheduler, PreemptionByRecomputeKeepsOutputsExact) {
  FakeBackend be;
  be.capacity = 40;  // two sequences of 15 + 12 do not fit together for long
  SchedulerOptions o;
  o.max_running = 2;
  Scheduler s(be, o);
  Out a, b;
  ASSERT_TRUE(s.submit(make(15, 12, &a, 1)));
  ASSERT_TRUE(s.submit(make(15, 12, &b, 2)));
  run_all(s);
  EXPECT_GT(s.stats().preemptions, 0);
  EXPECT_EQ(a.ids, expected(15, 12, 1));
  EXPECT_EQ(b.ids, expected(15, 12, 2));
  EXPECT_EQ(a.why, FinishReason::length);
  EXPECT_EQ(b.why, FinishReason::length);
  EXPECT_TRUE(be.held.empty());
}

TEST(Scheduler, APromptLargerThanThePoolFailsAlone) {
  FakeBackend be;
  be.capacity = 10;
  Scheduler s(be, {});
  Out a;
  ASSERT_TRUE(s.submit(make(30, 2, &a)));
  run_all(s);
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.why, FinishReason::aborted);
  EXPECT_TRUE(be.held.empty());
}

TEST(Scheduler, CancellationReleasesTheSequence) {
  FakeBackend be;
  Scheduler s(be, {});
  Out a, b;
  auto ra = make(10, 100, &a), rb = make(10, 5, &b, 3);
  ASSERT_TRUE(s.submit(ra));
  ASSERT_TRUE(s.submit(rb));
  s.step();
  s.step();
  ra->cancelled = true;
  s.step();
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.why, FinishReason::aborted);
  EXPECT_EQ(be.held.count(ra.get()), 0u);
  run_all(s);
  EXPECT_EQ(b.ids, expected(10, 5, 3));
}

}  // namespace
}  // namespace k3
