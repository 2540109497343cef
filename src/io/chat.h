// chat.h: chat messages -> prompt token ids, and generated ids -> reasoning / content / tool calls
// (FORMATS.md §2-3). Two families share this interface:
//   K2 (Kimi-Linear): <|im_R|> NAME <|im_middle|> BODY <|im_end|>            (chat_k2.h)
//   K3 / K3.1 XTML:   <|open|>TAG ATTRS<|sep|> BODY <|close|>TAG<|sep|> [EOM] (chat_k3.h)
//
// Contract:
//   render(messages, options) -> prompt ids. Markers are special ids looked up by NAME at construction;
//     every piece of caller text (content, names, attribute values, JSON) is encoded as ordinary text
//     (allow_special = false), so user text can never forge a marker. Bad input (unknown role, a tool
//     message without a matching call, a bad thinking_effort, a named tool_choice) -> invalid_argument,
//     which the server turns into a 400.
//   make_parser(options) -> OutputParser fed the generated ids one at a time (or in any chunks). It emits
//     reasoning/content deltas (never half a UTF-8 character, never a marker) and each tool call whole,
//     once its closing marker arrives. The summary (result()) is by construction the concatenation of
//     the emitted deltas, so streaming and whole-output parsing agree for every split of the ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/tokenizer.h"
#include "k3/config.h"

namespace k3 {

using ojson = nlohmann::ordered_json;   // keeps the client's key order (K2 tool_declare, call arguments)

struct ToolCall {
  std::string id;                  // K2: "functions.{name}:{idx}"; K3 output: "call_<random>"
  std::string name;
  std::string arguments;           // raw JSON text (an object for well-formed calls)
};

struct Message {
  std::string role;                // system | developer (= system) | user | assistant | tool
  std::string content;             // text parts already joined by the caller; null content = ""
  std::string name;                // optional
  std::string reasoning;           // assistant: reasoning_content or reasoning
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;        // tool
};

struct ChatOptions {
  ojson tools;                     // the request's tools[] (array) or null
  ojson tool_choice;               // null | "auto" | "none" | "required"; an object (named) -> error
  bool thinking = true;            // chat_template_kwargs.thinking / enable_thinking
  std::optional<std::string> thinking_effort;  // low | high | max; unset -> "max" (K3 tokenizer default)
  ojson response_format;           // {"type":"json_object"} | {"type":"json_schema",...} | null
  bool add_generation_prompt = true;
  uint64_t tool_call_id_seed = 0;  // parser: seed of the "call_<random>" ids (0 = nondeterministic)
};

// One step of parsed output.
struct ChatEvent {
  enum class Kind { reasoning, content, tool_call };
  Kind kind;
  std::string text;                // reasoning / content delta (whole UTF-8 characters)
  ToolCall call;                   // tool_call only
  int index = 0;                   // tool_call only: 0-based position among this output's calls
};

struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  int n_reasoning_tokens = 0;      // ids consumed inside the reasoning channel (usage details)
  // "tool_calls" when at least one call was parsed, else "" (the caller picks stop / length).
  std::string finish_reason_hint() const { return tool_calls.empty() ? "" : "tool_calls"; }
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Feeds generated ids; appends the events they complete to `events`.
  void push(int32_t id, std::vector<ChatEvent>& events);
  void push(std::span<const int32_t> ids, std::vector<ChatEvent>& events);
  // End of generation: flushes held-back text (an incomplete UTF-8 tail becomes U+FFFD). Idempotent.
  void finish(std::vector<ChatEvent>& events);
  // Concatenation of every event emitted so far.
  const ParsedOutput& result() const { return out_; }
  // True once the reasoning channel is closed (or was never open).
  virtual bool reasoning_ended() const = 0;

 protected:
  virtual void on_token(int32_t id) = 0;
  virtual void on_finish() = 0;
  void emit_text(ChatEvent::Kind kind, std::string text);
  void emit_call(ToolCall call);
  void count_reasoning_token() { out_.n_reasoning_tokens++; }

 private:
  ParsedOutput out_;
  std::vector<ChatEvent>* sink_ = nullptr;
  bool finished_ = false;
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual Result<std::vector<int32_t>> render(const std::vector<Message>& messages,
                                              const ChatOptions& options) const = 0;
  // The same prompt as text, markers spelled by name (debugging, `k3 chat --show-prompt`, tests).
  virtual Result<std::string> render_text(const std::vector<Message>& messages,
                                          const ChatOptions& options) const = 0;
  virtual std::unique_ptr<OutputParser> make_parser(const ChatOptions& options) const = 0;
  // Ids that end a turn (K2 <|im_end|>, K3 <|end_of_msg|>); the engine adds [EOS] (FORMATS §3).
  virtual std::vector<int32_t> stop_ids() const = 0;
};

// The format of a checkpoint family (ModelConfig::chat_format()). Fails when a marker is missing.
Result<std::unique_ptr<ChatTemplate>> make_chat_template(ChatFormat format, const Tokenizer& tok);

// ---- helpers shared by the formats (chat.cpp) ----

// A prompt piece: one marker id (special >= 0, text = its name) or ordinary text (special = -1).
struct Segment {
  int32_t special = -1;
  std::string text;
};
// Ids of the segments. Text is encoded with allow_special = false; merge_text joins adjacent text
// segments first (K2: HF encodes the rendered string split at specials), K3 encodes each one alone.
std::vector<int32_t> encode_segments(const Tokenizer& tok, const std::vector<Segment>& segs, bool merge_text);
std::string segments_text(const std::vector<Segment>& segs);

// A special id by name, or a not_found Status naming the marker and the format.
Result<int32_t> require_special(const Tokenizer& tok, std::string_view name, std::string_view format);

// Checks what both formats reject: roles, tool_choice, thinking_effort. Returns the effort to use
// ("" = none) under the K3 rules (unset -> "max", only when thinking is on).
Result<std::string> validate_common(const std::vector<Message>& messages, const ChatOptions& options);

// Python json.dumps(value, ensure_ascii=False) with its default (", ", ": ") separators, or the
// compact (",", ":") ones; key order as stored. Invalid UTF-8 in strings becomes U+FFFD.
std::string py_json_dumps(const ojson& value, bool compact);

// Recursively sorted keys (Python _deep_sort), as an ordered_json whose order is now sorted.
ojson deep_sorted(const ojson& value);

// Nesting limit for JSON we render or parse (recursive dumping must not overflow the stack).
constexpr int kMaxJsonDepth = 128;
// Deepest [ / { nesting in JSON text, counted outside strings (no parse).
int json_text_depth(std::string_view text);
// Deepest nesting of a parsed value (iterative).
int json_depth(const ojson& value);

// Length of the longest prefix of `bytes` that ends on a UTF-8 character boundary, treating a
// truncated multi-byte sequence at the end as incomplete (held back) and any other bad byte as complete.
size_t utf8_complete_prefix(std::string_view bytes);
// Replaces invalid UTF-8 with U+FFFD.
std::string utf8_sanitize(std::string_view bytes);

}  // namespace k3
