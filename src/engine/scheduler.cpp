// scheduler.cpp: continuous batching, chunked prefill, preemption by recompute (scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

namespace k3 {

bool Scheduler::submit(std::shared_ptr<Request> r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (int(incoming_.size() + n_waiting_) >= opt_.max_queue) {
    stats_.rejected++;
    return false;
  }
  incoming_.push_back(std::move(r));
  return true;
}

int Scheduler::n_waiting() {
  std::lock_guard<std::mutex> lock(mu_);
  return int(incoming_.size() + n_waiting_);
}

void Scheduler::cancel_all() {
  take_incoming();
  for (auto& r : running_) r->cancelled = true;
  for (auto& r : waiting_) r->cancelled = true;
}

bool Scheduler::idle() {
  return running_.empty() && n_waiting() == 0;
}

void Scheduler::take_incoming() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!incoming_.empty()) {
    std::shared_ptr<Request> r = std::move(incoming_.front());
    incoming_.pop_front();
    r->id = next_id_++;
    r->tokens = r->prompt;
    r->n_prefill = int64_t(r->prompt.size());
    r->is_long = int64_t(r->prompt.size()) >= opt_.long_prompt;
    r->sampler = std::make_unique<Sampler>(r->sampling);
    waiting_.push_back(std::move(r));
  }
  n_waiting_ = waiting_.size();
}

void Scheduler::finish(Request& r, FinishReason why, const Status& err, bool keep) {
  std::shared_ptr<Request> hold;  // the queues may hold the last reference
  for (auto& p : running_)
    if (p.get() == &r) hold = p;
  for (auto& p : waiting_)
    if (p.get() == &r) hold = p;
  if (r.phase == Request::Phase::prefill || r.phase == Request::Phase::decode) be_.stop(r, keep);
  r.phase = Request::Phase::done;
  std::erase_if(running_, [&](const auto& p) { return p.get() == &r; });
  std::erase_if(waiting_, [&](const auto& p) { return p.get() == &r; });
  stats_.finished++;
  if (r.on_done) r.on_done(why, err);
}

void Scheduler::preempt(Request& r) {
  be_.stop(r, false);
  r.state.reset();
  r.phase = Request::Phase::waiting;
  r.n_fed = 0;
  r.resume_decode = r.n_generated > 0;  // the last generated id is pending: re-feed all before it
  r.n_prefill = int64_t(r.tokens.size()) - (r.resume_decode ? 1 : 0);
  r.n_preempted++;
  stats_.preemptions++;
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == &r) {
      waiting_.push_front(*it);
      running_.erase(it);
      break;
    }
}

bool Scheduler::make_room(const Request& keep) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if (it->get() != &keep) {
      preempt(**it);
      return true;
    }
  return false;
}

void Scheduler::admit() {
  while (int(running_.size()) < opt_.max_running && !waiting_.empty()) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [](const auto& r) { return !r->is_long; });
    if (it == waiting_.end()) it = waiting_.begin();
    std::shared_ptr<Request> r = *it;
    Result<int64_t> hit = be_.start(*r);
    if (!hit.ok()) {
      if (hit.status().code() == Code::out_of_memory && !running_.empty()) break;  // wait for room
      waiting_.erase(it);
      finish(*r, FinishReason::aborted, hit.status(), false);
      continue;
    }
    waiting_.erase(it);
    r->n_fed = *hit;
    if (r->n_preempted == 0) r->n_cached = *hit;
    r->phase = Request::Phase::prefill;
    r->admitted_step = stats_.steps;
    running_.push_back(r);
  }
  n_waiting_ = waiting_.size();
}

void Scheduler::sample(Request& r) {
  SampleResult res;
  const int32_t id = r.sampler->sample(r.logits, r.tokens, &res);
  if (r.first_token_step < 0) r.first_token_step = stats_.steps;
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end())
    return finish(r, FinishReason::stop, ok_status(), true);
  r.tokens.push_back(id);
  r.n_generated++;
  if (r.on_token && !r.on_token(id, res)) return finish(r, FinishReason::aborted, ok_status(), false);
  if (r.n_generated >= r.max_new || int64_t(r.tokens.size()) >= r.n_ctx)
    finish(r, FinishReason::length, ok_status(), true);
}

void Scheduler::run_prefill(int budget) {
  int long_budget = opt_.long_step_tokens;
  for (bool long_pass : {false, true}) {
    std::vector<std::shared_ptr<Request>> order = running_;
    for (auto& rp : order) {
      Request& r = *rp;
      if (r.phase != Request::Phase::prefill || r.is_long != long_pass) continue;
      for (int attempt = 0; attempt < 2 && r.phase == Request::Phase::prefill; ++attempt) {
        int64_t n = std::min<int64_t>(r.n_prefill - r.n_fed, budget);
        if (long_pass) n = std::min<int64_t>(n, long_budget);
        if (n <= 0) break;
        Status s = be_.prefill(r, std::span<const int32_t>(r.tokens).subspan(size_t(r.n_fed), size_t(n)));
        if (!s.ok()) {
          if (s.code() == Code::out_of_memory && attempt == 0 && make_room(r)) continue;
          finish(r, FinishReason::aborted, s, false);
          break;
        }
        r.n_fed += n;
        budget -= int(n);
        if (long_pass) long_budget -= int(n);
        stats_.prefill_tokens += n;
        if (r.n_fed == r.n_prefill) {
          r.phase = Request::Phase::decode;
          if (!r.resume_decode) sample(r);
          r.resume_decode = false;
        }
        break;
      }
    }
  }
}

bool Scheduler::step() {
  take_incoming();
  for (auto& r : std::vector<std::shared_ptr<Request>>(running_))
    if (r->cancelled) finish(*r, FinishReason::aborted, ok_status(), false);
  for (auto& r : std::vector<std::shared_ptr<Request>>(waiting_.begin(), waiting_.end()))
    if (r->cancelled) finish(*r, FinishReason::aborted, ok_status(), false);
  if (running_.empty() && waiting_.empty()) {
    n_waiting_ = 0;
    return false;
  }
  admit();
  int budget = opt_.step_tokens;
  // decode: one pending id per request, batched
  for (int attempt = 0; attempt <= opt_.max_running; ++attempt) {
    std::vector<Request*> dec;
    for (auto& r : running_)
      if (r->phase == Request::Phase::decode) dec.push_back(r.get());
    if (dec.empty()) break;
    int failed = -1;
    Status s = be_.decode(dec, &failed);
    if (s.ok()) {
      for (Request* r : dec) {
        r->n_fed++;
        stats_.decode_tokens++;
        budget--;
        sample(*r);
      }
      break;
    }
    if (s.code() == Code::out_of_memory && failed >= 0) {
      if (!make_room(*dec[size_t(failed)])) finish(*dec[size_t(failed)], FinishReason::aborted, s, false);
      continue;
    }
    for (Request* r : dec) finish(*r, FinishReason::aborted, s, false);
    break;
  }
  run_prefill(std::max(budget, 0));
  std::vector<Request*> live;
  for (auto& r : running_) live.push_back(r.get());
  be_.end_step(live);
  stats_.steps++;
  n_waiting_ = waiting_.size();
  return true;
}

}  // namespace k3
