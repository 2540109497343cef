// chat_k3_parser.cpp: incremental parser of K3 XTML output (FORMATS.md §2.2 "Parsing", vLLM kimi_k3
// reasoning + tool parsers), one generated id at a time.
//
//   marker  := (OPEN | CLOSE) tag-text-tokens SEP      the tag text may span several BPE tokens; it is
//              held back from OPEN/CLOSE until SEP, then read as `name attr="v"...` (\s tolerated)
//   channels: reasoning (prompt ended OPEN think SEP) -> CLOSE think SEP -> OPEN response SEP content
//             CLOSE response SEP -> [OPEN tools SEP calls CLOSE tools SEP] -> CLOSE message SEP (EOM)
//   a call is emitted whole at CLOSE call SEP: id "call_<24 alnum>", arguments = json.dumps(args,
//   ensure_ascii=False) with string args raw and other types JSON-decoded (raw text if malformed);
//   a `json` block's raw text is the arguments verbatim.
// Text outside any channel (after CLOSE think, before a response) counts as content, like vLLM.
// An OPEN/CLOSE whose tag exceeds kMaxTag bytes or is cut by another special is not a marker: the
// marker id is dropped and its text joins the current channel. A marker unfinished at the end is dropped.
#include <random>

#include "io/chat_k3.h"

namespace k3 {

namespace {

constexpr size_t kMaxTag = 1024;   // bytes of tag + attributes between OPEN/CLOSE and SEP

struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::string attr(const std::string& k) const {
    for (const auto& [key, v] : attrs) if (key == k) return v;
    return "";
  }
};

bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `name k="v" k2="v2"`, whitespace-tolerant; attribute pairs found as \w+="[^"]*" anywhere after the name.
Tag parse_tag(std::string_view s) {
  Tag t;
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  size_t b = i;
  while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  t.name = std::string(s.substr(b, i - b));
  while (i < s.size()) {
    if (!is_word(s[i])) { ++i; continue; }
    size_t kb = i;
    while (i < s.size() && is_word(s[i])) ++i;
    if (i + 1 < s.size() && s[i] == '=' && s[i + 1] == '"') {
      size_t ve = s.find('"', i + 2);
      if (ve == std::string_view::npos) break;
      t.attrs.push_back({std::string(s.substr(kb, i - kb)), xtml_unescape_attr(s.substr(i + 2, ve - i - 2))});
      i = ve + 1;
    }
  }
  return t;
}

class K3Parser final : public OutputParser {
 public:
  K3Parser(const Tokenizer& tok, const K3Markers& m, const ChatOptions& o)
      : tok_(tok), m_(m), ch_(o.thinking ? Ch::reasoning : Ch::response),
        rng_(o.tool_call_id_seed ? o.tool_call_id_seed : std::random_device{}()) {}

  bool reasoning_ended() const override { return ch_ != Ch::reasoning; }

 protected:
  void on_token(int32_t id) override {
    if (ch_ == Ch::done) return;
    if (ch_ == Ch::reasoning) count_reasoning_token();
    if (marker_ >= 0) {
      if (id == m_.sep) {
        bool open = marker_ == m_.open;
        marker_ = -1;
        on_marker(open, parse_tag(tag_));
        return;
      }
      if (!tok_.is_special(id) && tag_.size() < kMaxTag) {
        tag_ += tok_.token_bytes(id);
        return;
      }
      marker_ = -1;          // not a marker: its text is ordinary text; `id` is handled below
      on_bytes(tag_);
    }
    if (id == m_.open || id == m_.close) {
      marker_ = id;
      tag_.clear();
    } else if (id == m_.eom) {
      flush_text();
      ch_ = Ch::done;
    } else if (!tok_.is_special(id)) {
      on_bytes(tok_.token_bytes(id));
    }
  }

  void on_finish() override { flush_text(); }

 private:
  enum class Ch { reasoning, between, response, tools, call, argument, json, done };
  bool in_text() const { return ch_ == Ch::reasoning || ch_ == Ch::between || ch_ == Ch::response; }
  bool in_call() const { return ch_ == Ch::call || ch_ == Ch::argument || ch_ == Ch::json; }

  void on_bytes(const std::string& b) {
    if (in_text()) {
      text_ += b;
      size_t n = utf8_complete_prefix(text_);
      emit_text(kind(), utf8_sanitize(std::string_view(text_).substr(0, n)));
      text_.erase(0, n);
    } else if (ch_ == Ch::argument) {
      arg_raw_ += b;
    } else if (ch_ == Ch::json) {
      json_raw_ += b;
    }  // tools / call: whitespace between elements, dropped
  }

  ChatEvent::Kind kind() const { return ch_ == Ch::reasoning ? ChatEvent::Kind::reasoning : ChatEvent::Kind::content; }

  void flush_text() {
    if (!text_.empty()) emit_text(kind(), utf8_sanitize(text_));
    text_.clear();
  }

  void on_marker(bool open, const Tag& t) {
    flush_text();
    const std::string& n = t.name;
    if (n == "message") {
      if (!open) ch_ = Ch::done;  // an unfinished call is dropped
    } else if (n == "think") {
      if (open && in_text()) ch_ = Ch::reasoning;
      if (!open && ch_ == Ch::reasoning) ch_ = Ch::between;
    } else if (n == "response") {
      if (open && in_text()) ch_ = Ch::response;
      if (!open && ch_ == Ch::response) ch_ = Ch::between;
    } else if (n == "tools") {
      if (open && in_text()) ch_ = Ch::tools;
      if (!open && (ch_ == Ch::tools || in_call())) ch_ = Ch::between;
    } else if (n == "call") {
      if (open && (in_text() || ch_ == Ch::tools)) {
        ch_ = Ch::call;
        call_name_ = t.attr("tool");
        args_ = ojson::object();
        json_raw_.clear();
        has_json_ = false;
      } else if (!open && in_call()) {
        if (ch_ == Ch::argument) end_argument();
        end_call();
        ch_ = Ch::tools;
      }
    } else if (n == "argument") {
      if (ch_ == Ch::argument) end_argument();
      if (open && ch_ == Ch::call) {
        ch_ = Ch::argument;
        arg_key_ = t.attr("key");
        arg_type_ = t.attr("type");
        arg_raw_.clear();
      }
    } else if (n == "json") {
      if (open && ch_ == Ch::call) {
        ch_ = Ch::json;
        has_json_ = true;
      } else if (!open && ch_ == Ch::json) {
        ch_ = Ch::call;
      }
    }
  }

  void end_argument() {
    ojson v;
    if (arg_type_.empty() || arg_type_ == "string") {
      v = utf8_sanitize(arg_raw_);
    } else {
      v = ojson(ojson::value_t::discarded);
      if (json_text_depth(arg_raw_) <= kMaxJsonDepth) v = ojson::parse(arg_raw_, nullptr, /*allow_exceptions=*/false);
      if (v.is_discarded()) v = utf8_sanitize(arg_raw_);
    }
    args_[arg_key_] = std::move(v);
    ch_ = Ch::call;
  }

  void end_call() {
    if (call_name_.empty()) return;  // a call without a tool name is dropped (vLLM)
    ToolCall c;
    c.id = "call_" + random_suffix();
    c.name = utf8_sanitize(call_name_);
    c.arguments = has_json_ ? utf8_sanitize(json_raw_) : py_json_dumps(args_, /*compact=*/false);
    emit_call(std::move(c));
  }

  std::string random_suffix() {
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string s(24, ' ');
    for (char& c : s) c = kAlnum[rng_() % 62];
    return s;
  }

  const Tokenizer& tok_;
  K3Markers m_;
  Ch ch_;
  int32_t marker_ = -1;            // OPEN or CLOSE whose tag is being collected; -1 = none
  std::string tag_;                // tag bytes since marker_
  std::string text_;               // held-back bytes of the current text channel (incomplete UTF-8)
  std::string call_name_;
  ojson args_;                     // arguments of the call being read, in emitted order
  std::string arg_key_, arg_type_, arg_raw_;
  std::string json_raw_;
  bool has_json_ = false;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<OutputParser> make_k3_parser(const Tokenizer& tok, const K3Markers& m, const ChatOptions& options) {
  return std::make_unique<K3Parser>(tok, m, options);
}

}  // namespace k3
