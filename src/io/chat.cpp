// chat.cpp: what both chat formats share: the factory, request validation, the OutputParser event
// plumbing, segment encoding, Python-compatible JSON dumping and UTF-8 hold-back (FORMATS.md §2-3).
#include "io/chat.h"

#include <algorithm>

#include "io/chat_k2.h"
#include "io/chat_k3.h"
#include "io/utf8.h"

namespace k3 {

// ---- OutputParser: every delta goes to the caller's sink and into the running summary ----

void OutputParser::push(int32_t id, std::vector<ChatEvent>& events) {
  if (finished_) return;
  sink_ = &events;
  on_token(id);
  sink_ = nullptr;
}

void OutputParser::push(std::span<const int32_t> ids, std::vector<ChatEvent>& events) {
  for (int32_t id : ids) push(id, events);
}

void OutputParser::finish(std::vector<ChatEvent>& events) {
  if (finished_) return;
  sink_ = &events;
  on_finish();
  sink_ = nullptr;
  finished_ = true;
}

void OutputParser::emit_text(ChatEvent::Kind kind, std::string text) {
  if (text.empty()) return;
  K3_ASSERT(kind != ChatEvent::Kind::tool_call && sink_ != nullptr);
  (kind == ChatEvent::Kind::reasoning ? out_.reasoning : out_.content) += text;
  sink_->push_back(ChatEvent{kind, std::move(text), {}, 0});
}

void OutputParser::emit_call(ToolCall call) {
  K3_ASSERT(sink_ != nullptr);
  int index = static_cast<int>(out_.tool_calls.size());
  out_.tool_calls.push_back(call);
  sink_->push_back(ChatEvent{ChatEvent::Kind::tool_call, {}, std::move(call), index});
}

// ---- factory and validation ----

Result<std::unique_ptr<ChatTemplate>> make_chat_template(ChatFormat format, const Tokenizer& tok) {
  switch (format) {
    case ChatFormat::k2: return K2Template::create(tok, /*think_variant=*/false);
    case ChatFormat::k3_xtml: return K3Template::create(tok);
  }
  return error(Code::internal, "unknown chat format");
}

Result<int32_t> require_special(const Tokenizer& tok, std::string_view name, std::string_view format) {
  std::optional<int32_t> id = tok.special_id(name);
  if (!id) {
    return error(Code::not_found, std::string(format) + " chat format: the tokenizer has no special token '" +
                                      std::string(name) + "' (tokenizer_config.json added_tokens_decoder)");
  }
  return *id;
}

static bool is_role(const std::string& r) {
  return r == "system" || r == "developer" || r == "user" || r == "assistant" || r == "tool";
}

Result<std::string> validate_common(const std::vector<Message>& messages, const ChatOptions& options) {
  // Tool results must answer a call of the latest assistant message (by id, or by position when
  // the id is absent). The K3 alias "{name}:{0-based position}" is accepted too (vLLM renderer).
  const Message* last_assistant = nullptr;
  size_t n_tool_since_assistant = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!is_role(m.role)) {
      return error(Code::invalid_argument,
                   where + ".role '" + m.role + "' is not one of system, developer, user, assistant, tool");
    }
    if (m.role == "assistant") {
      last_assistant = &m;
      n_tool_since_assistant = 0;
      for (const ToolCall& c : m.tool_calls) {
        if (c.name.empty()) return error(Code::invalid_argument, where + ".tool_calls[].function.name is empty");
      }
    }
    if (m.role != "tool") continue;
    n_tool_since_assistant++;
    if (last_assistant == nullptr || last_assistant->tool_calls.empty()) {
      return error(Code::invalid_argument, where + ": a tool message must follow an assistant message with tool_calls");
    }
    const auto& calls = last_assistant->tool_calls;
    if (m.tool_call_id.empty()) {
      if (n_tool_since_assistant > calls.size()) {
        return error(Code::invalid_argument, where + ": tool message without tool_call_id and no call left to answer");
      }
      continue;
    }
    bool found = false;
    for (size_t k = 0; k < calls.size() && !found; ++k) {
      found = calls[k].id == m.tool_call_id || calls[k].name + ":" + std::to_string(k) == m.tool_call_id;
    }
    if (!found) {
      return error(Code::invalid_argument, where + ".tool_call_id '" + m.tool_call_id +
                                               "' matches no tool call of the preceding assistant message");
    }
  }

  const ojson& tc = options.tool_choice;
  if (tc.is_object()) {
    return error(Code::invalid_argument,
                 "tool_choice: a named function needs constrained decoding, which this server does not have; "
                 "use \"auto\", \"required\" or \"none\"");
  }
  if (!tc.is_null()) {
    std::string s = tc.is_string() ? tc.get<std::string>() : tc.dump();
    if (s != "auto" && s != "none" && s != "required") {
      return error(Code::invalid_argument, "tool_choice '" + s + "' is not one of auto, none, required");
    }
  }
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return error(Code::invalid_argument, "tools must be an array");
  }
  if (json_depth(options.tools) > kMaxJsonDepth || json_depth(options.response_format) > kMaxJsonDepth) {
    return error(Code::invalid_argument, "tools / response_format nested deeper than " + std::to_string(kMaxJsonDepth));
  }
  for (const Message& m : messages) {
    for (const ToolCall& c : m.tool_calls) {
      if (json_text_depth(c.arguments) > kMaxJsonDepth) {
        return error(Code::invalid_argument, "tool call '" + c.name + "': arguments nested deeper than " +
                                                 std::to_string(kMaxJsonDepth));
      }
    }
  }
  if (options.thinking_effort) {
    const std::string& e = *options.thinking_effort;
    if (e != "low" && e != "high" && e != "max") {
      return error(Code::invalid_argument, "thinking_effort '" + e + "' is not one of low, high, max");
    }
  }
  if (!options.thinking) return std::string();
  return options.thinking_effort.value_or("max");
}

// ---- segments ----

std::vector<int32_t> encode_segments(const Tokenizer& tok, const std::vector<Segment>& segs, bool merge_text) {
  std::vector<int32_t> ids;
  std::string text;
  auto flush = [&] {
    if (text.empty()) return;
    std::vector<int32_t> t = tok.encode(text, /*allow_special=*/false);
    ids.insert(ids.end(), t.begin(), t.end());
    text.clear();
  };
  for (const Segment& s : segs) {
    if (s.special >= 0) {
      flush();
      ids.push_back(s.special);
    } else {
      text += s.text;
      if (!merge_text) flush();
    }
  }
  flush();
  return ids;
}

std::string segments_text(const std::vector<Segment>& segs) {
  std::string s;
  for (const Segment& g : segs) s += g.text;
  return s;
}

// ---- JSON as Python's json.dumps(ensure_ascii=False) writes it ----

static void dump_into(const ojson& v, bool compact, std::string& out) {
  const char* item_sep = compact ? "," : ", ";
  const char* key_sep = compact ? ":" : ": ";
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += item_sep;
      first = false;
      out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
      out += key_sep;
      dump_into(it.value(), compact, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += item_sep;
      dump_into(v[i], compact, out);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
}

std::string py_json_dumps(const ojson& value, bool compact) {
  std::string out;
  dump_into(value, compact, out);
  return out;
}

ojson deep_sorted(const ojson& value) {
  if (value.is_array()) {
    ojson a = ojson::array();
    for (const auto& e : value) a.push_back(deep_sorted(e));
    return a;
  }
  if (!value.is_object()) return value;
  std::vector<std::string> keys;
  for (auto it = value.begin(); it != value.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());  // UTF-8 byte order = code point order (Python sorted)
  ojson o = ojson::object();
  for (const auto& k : keys) o[k] = deep_sorted(value.at(k));
  return o;
}

int json_text_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

int json_depth(const ojson& value) {
  int max_depth = 0;
  std::vector<std::pair<const ojson*, int>> stack = {{&value, 0}};
  while (!stack.empty()) {
    auto [v, d] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    max_depth = std::max(max_depth, d + 1);
    for (const auto& e : *v) stack.push_back({&e, d + 1});
  }
  return max_depth;
}

// ---- UTF-8 ----

// Expected length of a sequence from its lead byte; 0 for a continuation or invalid byte.
static int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

size_t utf8_complete_prefix(std::string_view b) {
  size_t n = b.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(b[n - back]);
    if ((c & 0xC0) == 0x80) continue;       // continuation byte: keep looking for the lead
    int len = utf8_len(c);
    return (len > static_cast<int>(back)) ? n - back : n;
  }
  return n;
}

std::string utf8_sanitize(std::string_view b) { return utf8::sanitize(b); }

}  // namespace k3
