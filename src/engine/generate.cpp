// generate.cpp: stop-string matching and the prefill + decode loop (contract in generate.h).
#include "engine/generate.h"

#include <algorithm>
#include <chrono>

namespace k3 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  // The earliest complete stop string wins (the longest on a tie at the same position).
  size_t at = std::string::npos;
  for (const auto& s : stops_) {
    const size_t p = held_.find(s);
    if (p != std::string::npos && (p < at || (p == at && s.size() > matched_.size()))) {
      at = p;
      matched_ = s;
    }
  }
  if (at != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string; emit the rest.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::aborted:
      return "aborted";
  }
  return "?";
}

Result<GenerateResult> generate(const StepFn& step, const Tokenizer& tok, std::span<const int32_t> prompt,
                                const GenerateOptions& opt, Sampler& sampler, const TokenFn& on_token) {
  if (prompt.empty()) return error(Code::invalid_argument, "generate: the prompt is empty");
  if (opt.n_cached < 0 || opt.n_cached >= int64_t(prompt.size()))
    return error(Code::invalid_argument, "generate: n_cached must leave at least one prompt id to feed");
  if (int64_t(prompt.size()) > opt.n_ctx)
    return error(Code::invalid_argument, "generate: the prompt has " + std::to_string(prompt.size()) +
                                             " tokens, more than the context size " +
                                             std::to_string(opt.n_ctx));
  GenerateResult r;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits;

  auto t0 = std::chrono::steady_clock::now();
  const auto fresh = prompt.subspan(size_t(opt.n_cached));
  K3_RETURN_IF_ERROR(step(fresh, &logits).with_context("prefill"));
  r.t_prompt_s = seconds_since(t0);
  r.n_prompt_eval = int64_t(fresh.size());
  int64_t n_past = int64_t(prompt.size());

  StreamDecoder decoder(tok);
  StopMatcher matcher(opt.stop_strings);
  auto emit = [&](int32_t id, std::string text) {
    r.text += text;
    return on_token ? on_token(id, text) : true;
  };
  r.finish = FinishReason::length;
  for (;;) {
    if (opt.n_predict >= 0 && int64_t(r.tokens.size()) >= opt.n_predict) break;
    t0 = std::chrono::steady_clock::now();
    const int32_t id = sampler.sample(logits, history);
    r.t_sample_s += seconds_since(t0);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end()) {
      r.finish = FinishReason::stop;
      r.stop_id = id;
      break;
    }
    history.push_back(id);
    r.tokens.push_back(id);
    if (!emit(id, matcher.push(decoder.push(id)))) {
      r.finish = FinishReason::aborted;
      break;
    }
    if (matcher.stopped()) {
      r.finish = FinishReason::stop;
      break;
    }
    if (n_past >= opt.n_ctx) break;  // no room to feed the id back: "length"
    if (opt.n_predict >= 0 && int64_t(r.tokens.size()) >= opt.n_predict) break;  // nothing more to sample
    t0 = std::chrono::steady_clock::now();
    K3_RETURN_IF_ERROR(step(std::span<const int32_t>(&id, 1), &logits).with_context("decode"));
    r.t_decode_s += seconds_since(t0);
    ++r.n_decode_eval;
    ++n_past;
  }
  if (r.finish != FinishReason::aborted) {
    std::string tail = matcher.push(decoder.flush());
    tail += matcher.flush();
    if (!tail.empty()) emit(-1, std::move(tail));
  }
  return r;
}

Result<std::vector<int32_t>> fit_to_context(std::vector<int32_t> prompt, int64_t n_ctx, int n_predict,
                                            bool truncate) {
  if (n_ctx < 2) return error(Code::invalid_argument, "context size must be at least 2");
  if (int64_t(prompt.size()) < n_ctx) return prompt;
  if (!truncate)
    return error(Code::invalid_argument, "the prompt is " + std::to_string(prompt.size()) +
                                             " tokens, which leaves no room in the " + std::to_string(n_ctx) +
                                             "-token context (-c); raise -c or pass --truncate");
  const int64_t half = n_ctx / 2;
  const int64_t reserve = n_predict < 0 ? half : std::clamp<int64_t>(n_predict, 1, half);
  prompt.erase(prompt.begin(), prompt.end() - (n_ctx - reserve));
  return prompt;
}

}  // namespace k3
