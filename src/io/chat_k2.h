// chat_k2.h: the K2 `<|im_*|>` chat format used by Kimi-Linear (FORMATS.md §2.1, Kimi chat_template.jinja).
//
//   prompt := [<|im_system|>tool_declare<|im_middle|>TOOLS<|im_end|>]          TOOLS: compact JSON, key order kept
//             [<|im_system|>system<|im_middle|>You are Kimi, ...<|im_end|>]    when messages[0] is not system
//             turn*  [<|im_assistant|>assistant<|im_middle|>]                  generation prompt
//   turn   := <|im_R|> NAME <|im_middle|> BODY <|im_end|>     R = user | assistant | system (also tool)
//   tool result BODY := "## Return of {id}\n{content}"         NAME = message.name or "tool"
//   assistant BODY   := [<think>r</think>] content [<|tool_calls_section_begin|> (<|tool_call_begin|> ID
//                       <|tool_call_argument_begin|> ARGS <|tool_call_end|>)* <|tool_calls_section_end|>]
// ID = "functions.{name}:{idx}" (idx from 0 per message); a client id of another shape is rewritten to it,
// and the tool results that cite it are rewritten the same way. Text between markers is one segment
// (HF encodes the rendered string split at specials).
// Think variant (K2-Thinking style, off for Kimi-Linear): history assistants before the last plain
// assistant get <think></think>, later ones <think>reasoning</think>; gen prompt ends <think> or
// <think></think> when thinking is off. The parser accepts <think> whenever the tokenizer has it.
#pragma once

#include <memory>
#include <optional>

#include "io/chat.h"

namespace k3 {

struct K2Markers {
  int32_t im_user = -1, im_assistant = -1, im_system = -1, im_middle = -1, im_end = -1;
  int32_t section_begin = -1, section_end = -1, call_begin = -1, call_arg_begin = -1, call_end = -1;
  std::optional<int32_t> think_open, think_close;          // <think> </think>, if the tokenizer names them
  std::optional<int32_t> section_begin_singular;            // <|tool_call_section_begin|>, if special
};

class K2Template final : public ChatTemplate {
 public:
  static Result<std::unique_ptr<ChatTemplate>> create(const Tokenizer& tok, bool think_variant);

  Result<std::vector<int32_t>> render(const std::vector<Message>& messages,
                                      const ChatOptions& options) const override;
  Result<std::string> render_text(const std::vector<Message>& messages, const ChatOptions& options) const override;
  std::unique_ptr<OutputParser> make_parser(const ChatOptions& options) const override;
  std::vector<int32_t> stop_ids() const override { return {m_.im_end}; }

 private:
  K2Template(const Tokenizer& tok, K2Markers m, bool think) : tok_(tok), m_(m), think_(think) {}
  Result<std::vector<Segment>> build(const std::vector<Message>& messages, const ChatOptions& options) const;

  const Tokenizer& tok_;
  K2Markers m_;
  bool think_;                     // render <think> blocks (K2-Thinking); false for Kimi-Linear
};

// The incremental K2 output parser (chat_k2_parser.cpp); starts in reasoning when `start_in_reasoning`.
std::unique_ptr<OutputParser> make_k2_parser(const Tokenizer& tok, const K2Markers& m, bool start_in_reasoning);

// "functions.get_weather:0" -> "get_weather" (ID.split(":")[0].split(".")[-1]).
std::string k2_tool_name_from_id(std::string_view id);

}  // namespace k3
