// call.h (server-internal): the state of one completion call while it runs, shared by session.cpp (setup,
// token intake) and respond.cpp (response and SSE shapes).
//
// The engine thread pushes Events (a token with its log-probabilities, or the end) into each choice's
// Channel; the request thread pops them in poll() and turns them into client-visible ChatEvents.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/request.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "server/protocol.h"
#include "server/session.h"

namespace k3::server {

using Clock = std::chrono::steady_clock;

struct Event {
  bool done = false;
  int32_t id = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
  FinishReason why = FinishReason::aborted;
  Status err;
};

class Channel {
 public:
  void push(Event e);
  bool pop(Event* e, int wait_ms);  // false: nothing within wait_ms

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

// One generated token as the client sees it.
struct OutToken {
  int32_t id = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
  int64_t offset = 0;  // completions: code points of the choice's text before this token (text_offset)
};

struct Choice {
  int index = 0, prompt = 0;
  std::shared_ptr<Request> req;
  std::shared_ptr<Channel> ch = std::make_shared<Channel>();
  std::unique_ptr<OutputParser> parser;  // chat
  std::unique_ptr<StreamDecoder> dec;    // completions
  std::unique_ptr<StopMatcher> stop;
  std::vector<OutToken> toks;  // counted tokens (completion_tokens = toks.size())
  size_t toks_sent = 0;        // stream: tokens whose logprobs went out
  int64_t chars = 0;           // completions: code points of echo + token texts so far
  bool done = false, stop_hit = false, timed_out = false;
  FinishReason why = FinishReason::aborted;
  Status err;
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  Clock::time_point t0 = Clock::now();
};

struct PromptInfo {
  std::vector<int32_t> ids;
  std::string echo;  // completions: text put before the output
};

struct Call {
  bool chat = true;
  GenParams gen;
  std::string id;
  std::vector<PromptInfo> prompts;
  std::vector<Choice> choices;
  Clock::time_point deadline = Clock::time_point::max();
};

// Takes what arrived for c (waiting up to wait_ms), appending client-visible events to `out`.
void poll(const SessionEnv& env, const Call& call, Choice& c, std::vector<ChatEvent>& out, int wait_ms);
// The per-request timeout: not-yet-finished choices are cancelled and will end with "length".
void check_deadline(const SessionEnv& env, Call& call);
// A choice that ended in an error the client must see (engine failure or server shutdown).
bool failed(const Choice& c);

void respond_whole(const SessionEnv& env, Call& call, httplib::Response& res);
void respond_stream(const SessionEnv& env, std::shared_ptr<Call> call, httplib::Response& res);

std::string dump(const nlohmann::json& j);
int64_t code_points(std::string_view s);

}  // namespace k3::server
