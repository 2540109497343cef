// chat_k2_parser.cpp: incremental parser of K2 output (FORMATS.md §2.1 "Parsing output", vLLM kimi_k2
// tool + reasoning parsers), one generated id at a time.
//
//   [reasoning </think>] content <|tool_calls_section_begin|> (<|tool_call_begin|> ID
//   <|tool_call_argument_begin|> ARGS <|tool_call_end|>)* <|tool_calls_section_end|> [content] <|im_end|>
//   call := {id: ID verbatim, name: ID.split(":")[0].split(".")[-1], arguments: ARGS raw}  (both trimmed)
// Reasoning starts when the prompt ended with <think> (or at a <think> id) and ends at </think> or
// implicitly at the tool section. The singular "<|tool_call_section_begin|>" is accepted as a special id
// (if the tokenizer names it) or as plain text, held back while a suffix could still become it.
// Content before the tool section that is only "(no content)" (modulo surrounding whitespace) is a
// placeholder and dropped; it is held back while it could still be that.
#include "io/chat_k2.h"

namespace k3 {

namespace {

constexpr std::string_view kSingularBegin = "<|tool_call_section_begin|>";
constexpr std::string_view kNoContent = "(no content)";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

class K2Parser final : public OutputParser {
 public:
  K2Parser(const Tokenizer& tok, const K2Markers& m, bool reasoning)
      : tok_(tok), m_(m), st_(reasoning ? St::reasoning : St::content) {}

  bool reasoning_ended() const override { return st_ != St::reasoning; }

 protected:
  void on_token(int32_t id) override {
    if (st_ == St::done) return;
    if (st_ == St::reasoning) count_reasoning_token();
    bool section_begin = id == m_.section_begin || (m_.section_begin_singular && id == *m_.section_begin_singular);
    if (id == m_.im_end) {
      flush(true);
      st_ = St::done;
    } else if (section_begin && (st_ == St::reasoning || st_ == St::content)) {
      enter_section();
    } else if (m_.think_open && id == *m_.think_open && st_ == St::content) {
      flush(true);
      st_ = St::reasoning;
    } else if (m_.think_close && id == *m_.think_close && st_ == St::reasoning) {
      flush(true);
      st_ = St::content;
    } else if (id == m_.call_begin && st_ != St::reasoning && st_ != St::content) {
      st_ = St::call_id;                  // an unfinished previous call is dropped
      id_.clear();
      args_.clear();
    } else if (id == m_.call_arg_begin && st_ == St::call_id) {
      st_ = St::call_args;
    } else if (id == m_.call_end && st_ == St::call_args) {
      end_call();
      st_ = St::section;
    } else if (id == m_.section_end && st_ != St::reasoning && st_ != St::content) {
      st_ = St::content;
      pre_section_ = false;
    } else if (!tok_.is_special(id)) {
      on_bytes(tok_.token_bytes(id));
    }
  }

  void on_finish() override { flush(true); }

 private:
  enum class St { reasoning, content, section, call_id, call_args, done };

  void on_bytes(const std::string& b) {
    switch (st_) {
      case St::reasoning:
      case St::content: text_ += b; flush(false); break;
      case St::call_id: id_ += b; break;
      case St::call_args: args_ += b; break;
      default: break;                     // text inside the section, between calls
    }
  }

  // Emits what can no longer change; `all` at a boundary (marker, end) emits everything held.
  void flush(bool all) {
    ChatEvent::Kind kind = st_ == St::reasoning ? ChatEvent::Kind::reasoning : ChatEvent::Kind::content;
    if (st_ == St::content) {
      size_t at = text_.find(kSingularBegin);
      if (at != std::string::npos) {
        std::string before = text_.substr(0, at);
        text_ = before;
        emit_content(true);
        enter_section();
        return;
      }
    }
    if (kind == ChatEvent::Kind::reasoning) {
      size_t n = all ? text_.size() : utf8_complete_prefix(text_);
      emit_text(kind, utf8_sanitize(std::string_view(text_).substr(0, n)));
      text_.erase(0, n);
      return;
    }
    emit_content(all);
  }

  void emit_content(bool all) {
    // Not yet sendable: a tail that could still grow into the singular section marker.
    size_t hold = all ? 0 : partial_marker_suffix(text_, kSingularBegin);
    std::string_view body = std::string_view(text_).substr(0, text_.size() - hold);
    if (pre_section_ && !content_started_) {
      std::string_view t = body;
      while (!t.empty() && is_space(t.front())) t.remove_prefix(1);
      size_t k = std::min(t.size(), kNoContent.size());
      bool maybe_placeholder = t.substr(0, k) == kNoContent.substr(0, k) && trim(t.substr(k)).empty();
      if (maybe_placeholder) {
        if (!all) return;                 // could still be the placeholder: hold everything
        if (trim(t) == kNoContent) {
          text_.clear();                  // the placeholder: dropped
          return;
        }
      }
    }
    size_t n = all ? body.size() : utf8_complete_prefix(body);
    if (n == 0) return;
    content_started_ = true;
    emit_text(ChatEvent::Kind::content, utf8_sanitize(body.substr(0, n)));
    text_.erase(0, n);
  }

  void enter_section() {
    flush(true);
    text_.clear();
    st_ = St::section;
    pre_section_ = false;
  }

  void end_call() {
    std::string id = utf8_sanitize(trim(id_));
    std::string name = k2_tool_name_from_id(id);
    if (name.empty()) return;
    emit_call(ToolCall{id, name, utf8_sanitize(trim(args_))});
  }

  const Tokenizer& tok_;
  K2Markers m_;
  St st_;
  std::string text_;               // held-back reasoning/content bytes
  std::string id_, args_;          // the call being read
  bool pre_section_ = true;        // no tool section seen yet
  bool content_started_ = false;   // some pre-section content was emitted (no placeholder check needed)
};

}  // namespace

std::unique_ptr<OutputParser> make_k2_parser(const Tokenizer& tok, const K2Markers& m, bool start_in_reasoning) {
  return std::make_unique<K2Parser>(tok, m, start_in_reasoning);
}

}  // namespace k3
