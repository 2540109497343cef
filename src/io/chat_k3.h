// chat_k3.h: the K3 / K3.1 "XTML" chat format (FORMATS.md §2.2; encoding_k3.py as copied into vLLM).
//
//   element := OPEN TAG ATTR* SEP BODY CLOSE TAG SEP       ATTR := ' ' key '="' escape(value) '"'
//   message := element(TAG = "message") EOM                escape: & -> &amp; then " -> &quot;
//
// Prompt order: [tool-declare] [thinking-effort] messages... [tool-choice] [response-format] [gen prompt]
//   assistant body: [OPEN think SEP reasoning CLOSE think SEP] OPEN response SEP content CLOSE response SEP
//                   [OPEN tools SEP (OPEN call tool=".." index="i" SEP ARG* CLOSE call SEP)* CLOSE tools SEP]
//   ARG := OPEN argument key=".." type="{string|number|boolean|null|object|array}" SEP value CLOSE argument SEP
//   fallback for unparsable arguments: OPEN json type="object" SEP raw CLOSE json SEP
// OPEN/CLOSE/SEP/EOM are special ids; TAG, every attribute and every body is its own ordinary-text
// segment, encoded alone with allow_special = false (as TikTokenTokenizer._encode_chat_segments).
#pragma once

#include <memory>

#include "io/chat.h"

namespace k3 {

struct K3Markers {
  int32_t open = -1;               // <|open|>
  int32_t close = -1;              // <|close|>
  int32_t sep = -1;                // <|sep|>
  int32_t eom = -1;                // <|end_of_msg|> (stop)
};

class K3Template final : public ChatTemplate {
 public:
  static Result<std::unique_ptr<ChatTemplate>> create(const Tokenizer& tok);

  Result<std::vector<int32_t>> render(const std::vector<Message>& messages,
                                      const ChatOptions& options) const override;
  Result<std::string> render_text(const std::vector<Message>& messages, const ChatOptions& options) const override;
  std::unique_ptr<OutputParser> make_parser(const ChatOptions& options) const override;
  std::vector<int32_t> stop_ids() const override { return {m_.eom}; }

  // Whether the last think marker in `ids` (prompt + output) is a close (vLLM is_reasoning_end).
  bool reasoning_ended(std::span<const int32_t> ids) const;

 private:
  K3Template(const Tokenizer& tok, K3Markers m) : tok_(tok), m_(m) {}
  Result<std::vector<Segment>> build(const std::vector<Message>& messages, const ChatOptions& options) const;

  const Tokenizer& tok_;
  K3Markers m_;
};

// The incremental K3 output parser (chat_k3_parser.cpp).
std::unique_ptr<OutputParser> make_k3_parser(const Tokenizer& tok, const K3Markers& m, const ChatOptions& options);

// Attribute value escaping (& first, then ") and its inverse (&quot; first, then &amp;).
std::string xtml_escape_attr(std::string_view v);
std::string xtml_unescape_attr(std::string_view v);

}  // namespace k3
