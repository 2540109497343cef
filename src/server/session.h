// session.h: one /v1/chat/completions or /v1/completions call, from the parsed body to the response.
//
//   body -> parse (protocol.h) -> prompt ids (chat template | tokenizer | ids) -> n Requests submitted
//   non-stream: wait for every choice, then one JSON object (FORMATS.md §4.3, §4.5)
//   stream:     SSE chunks as the ids arrive (§4.4): role delta, reasoning, content, tool calls, final
//               chunk with finish_reason, the usage chunk (include_usage), [DONE]; the choices interleave
// Output handling per choice: chat ids -> OutputParser (reasoning / content / tool calls), content through
// the StopMatcher (stop strings across token boundaries); completion ids -> StreamDecoder -> StopMatcher.
// A completed stop string cancels the request (finish_reason "stop"). A client that disconnects cancels.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "k3/config.h"

namespace httplib {
struct Response;
}

namespace k3::server {

// Counters for /metrics (updated from any thread).
struct Metrics {
  std::atomic<int64_t> requests{0}, errors{0}, prompt_tokens{0}, generated_tokens{0}, cached_tokens{0};
  std::atomic<int64_t> running{0}, waiting{0}, pages_used{0}, pages_cached{0}, pages_total{0};
  std::atomic<int64_t> ttft_le[6] = {};  // time to first token histogram: <= 0.1, 0.5, 1, 5, 30 s, +Inf
  std::atomic<int64_t> ttft_count{0};
  std::atomic<double> ttft_sum{0};
  void observe_ttft(double s);
  std::string prometheus() const;
};

struct SessionEnv {
  const ModelConfig& cfg;
  const Tokenizer& tok;
  const ChatTemplate& tmpl;
  const std::string& model_id;
  int64_t n_ctx;
  int64_t created;
  Metrics& metrics;
  std::function<bool(const std::shared_ptr<Request>&)> submit;  // false: queue full
};

void run_session(const SessionEnv& env, bool chat, const nlohmann::json& body, httplib::Response& res);

}  // namespace k3::server
