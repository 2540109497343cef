// session.h: one /v1/chat/completions or /v1/completions call, from the parsed body to the response.
//
//   body -> parse (protocol.h) -> prompt ids per prompt (chat template | tokenizer | ids)
//        -> prompts x n Requests submitted (choice index = prompt * n + j, seed + index)
//   non-stream: wait for every choice, then one JSON object (FORMATS.md §4.3, §4.5)
//   stream:     SSE chunks as the ids arrive (§4.4): role delta, reasoning, content, tool calls, final
//               chunk with finish_reason, the usage chunk (include_usage), [DONE]; the choices interleave
// Output handling per choice: chat ids -> OutputParser (reasoning / content / tool calls), content through
// the StopMatcher (stop strings across token boundaries); completion ids -> StreamDecoder -> StopMatcher.
// A completed stop string cancels the request (finish_reason "stop").
// Ends other than the model's: the client goes away (stream: a failed write; non-stream: client_gone())
// -> cancelled, pages freed; the per-request timeout -> cancelled, finish_reason "length" with the text so
// far; server shutdown past its grace period -> cancelled, 503 (stream: an error event).
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
#include "server/metrics.h"

namespace httplib {
struct Response;
}

namespace k3::server {

struct SessionEnv {
  const ModelConfig& cfg;
  const Tokenizer& tok;
  const ChatTemplate& tmpl;
  const std::string& model_id;
  int64_t n_ctx;
  int64_t created;
  Metrics& metrics;
  std::function<bool(const std::shared_ptr<Request>&)> submit;  // false: queue full
  double timeout_s = 0;                                         // per request, 0 = none
  std::function<bool()> client_gone;                            // non-stream: has the client hung up?
};

void run_session(const SessionEnv& env, bool chat, const nlohmann::json& body, httplib::Response& res);

}  // namespace k3::server
