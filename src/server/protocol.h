// protocol.h: OpenAI request bodies -> engine parameters, and the error object (FORMATS.md §3-4).
//
//   chat:        model, messages[] (content: string | null | [{"type":"text","text"}]), tools, tool_choice,
//                chat_template_kwargs {thinking | enable_thinking, thinking_effort}, reasoning_effort
//                (none -> thinking off, minimal -> low, medium -> high), response_format
//                logprobs (bool), top_logprobs [0, 20] (needs logprobs: true)
//   completions: model, prompt (string | int[] | a list of strings / int[], one choice set per prompt),
//                echo, logprobs (int [0, 5]: top alternatives; echo with logprobs -> 400); suffix -> 400
//   both:        max_tokens = max_completion_tokens, n, temperature [0, 2], top_p, top_k, min_p,
//                presence/frequency/repetition penalty, logit_bias, seed, stop (string | <= 4 strings),
//                stop_token_ids, ignore_eos, stream, stream_options.include_usage, return_token_ids (vLLM)
// prompts x n <= kMaxChoices. A wrong type or value is an ApiError (400) naming the field in `param`;
// unknown fields are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "io/chat.h"

namespace k3::server {

using json = nlohmann::json;

struct ApiError {
  int http = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};
json error_body(const ApiError& e);

inline constexpr int kMaxChoices = 64;  // prompts x n of one request

struct GenParams {
  std::string model;    // "" when absent
  int max_tokens = -1;  // -1: the endpoint's default
  int n = 1;
  SamplerParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false, include_usage = false;
  bool logprobs = false;  // report log_softmax(raw logits) of each generated token
  int top_logprobs = 0;   // and this many best alternatives (chat 0..20, completions 0..5)
  bool return_token_ids = false;
};

struct ChatRequest {
  GenParams gen;
  std::vector<Message> messages;
  ChatOptions options;
};

struct CompletionPrompt {
  std::string text;                         // when given as text
  std::optional<std::vector<int32_t>> ids;  // when given as ids
};

struct CompletionRequest {
  GenParams gen;
  std::vector<CompletionPrompt> prompts;  // >= 1
  bool echo = false;
};

// Fill *out or return the error.
std::optional<ApiError> parse_chat(const json& body, int32_t n_vocab, ChatRequest* out);
std::optional<ApiError> parse_completion(const json& body, int32_t n_vocab, CompletionRequest* out);

}  // namespace k3::server
