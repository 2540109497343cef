// chat_k3.cpp: K3 XTML prompt rendering (FORMATS.md §2.2). The fixed system texts below are protocol
// strings the model was trained on; they must match encoding_k3.py byte for byte.
#include "io/chat_k3.h"

#include <algorithm>

#include "io/utf8.h"

namespace k3 {

namespace {

constexpr const char* kToolDeclareHead = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr const char* kEffortText =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
    "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
    "`thinking_effort=";
constexpr const char* kRawJsonText =
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";

// Python str.strip(): Unicode whitespace (str.isspace) at both ends; ill-formed bytes are not space.
std::string strip(std::string_view s) {
  size_t begin = s.size(), end = 0;
  for (size_t i = 0; i < s.size();) {
    utf8::Seq q = utf8::scan(s, i);
    size_t j = i;
    bool space = q.valid && utf8::python_isspace(utf8::next(s, j));
    if (!space) {
      begin = std::min(begin, i);
      end = i + q.len;
    }
    i += q.len;
  }
  return begin < end ? std::string(s.substr(begin, end - begin)) : std::string();
}

const char* xtml_type(const ojson& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

// Segment builder: one marker id or one text piece per call; empty text is dropped (encoding_k3 _segment).
struct Builder {
  const K3Markers& m;
  std::vector<Segment> segs;

  void marker(int32_t id, const char* name) { segs.push_back({id, name}); }
  void text(std::string s) {
    if (!s.empty()) segs.push_back({-1, std::move(s)});
  }
  void open(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& attrs = {}) {
    marker(m.open, "<|open|>");
    text(tag);
    for (const auto& [k, v] : attrs) text(" " + k + "=\"" + xtml_escape_attr(v) + "\"");
    marker(m.sep, "<|sep|>");
  }
  void close(const std::string& tag) {
    marker(m.close, "<|close|>");
    text(tag);
    marker(m.sep, "<|sep|>");
  }
  void eom() { marker(m.eom, "<|end_of_msg|>"); }
  void internal_system(const std::string& kind, const std::string& body) {
    open("message", {{"role", "system"}, {"type", kind}});
    text(strip(body));
    close("message");
    eom();
  }
};

// Tool results in a run after an assistant message, reordered to its call order when every one of
// them resolves by tool_call_id (or the "{name}:{pos}" alias); otherwise left as they came.
struct ToolResult {
  const Message* msg;
  std::string tool;                // resolved call name ("" = unresolved)
};

std::vector<ToolResult> order_tool_results(const std::vector<Message>& messages) {
  std::vector<ToolResult> out;
  const Message* assistant = nullptr;
  size_t i = 0;
  while (i < messages.size()) {
    if (messages[i].role != "tool") {
      if (messages[i].role == "assistant") assistant = &messages[i];
      out.push_back({&messages[i], ""});
      ++i;
      continue;
    }
    std::vector<std::pair<size_t, ToolResult>> run;  // (call position, result)
    bool unresolved = false;
    for (; i < messages.size() && messages[i].role == "tool"; ++i) {
      const Message& t = messages[i];
      size_t pos = SIZE_MAX;
      if (assistant && !t.tool_call_id.empty()) {
        const auto& calls = assistant->tool_calls;
        for (size_t k = 0; k < calls.size() && pos == SIZE_MAX; ++k) if (calls[k].id == t.tool_call_id) pos = k;
        for (size_t k = 0; k < calls.size() && pos == SIZE_MAX; ++k) {
          if (calls[k].name + ":" + std::to_string(k) == t.tool_call_id) pos = k;
        }
      }
      if (pos == SIZE_MAX) {
        unresolved = true;
        run.push_back({0, {&t, ""}});
      } else {
        run.push_back({pos, {&t, assistant->tool_calls[pos].name}});
      }
    }
    if (!unresolved) {
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    for (auto& r : run) out.push_back(unresolved ? ToolResult{r.second.msg, ""} : r.second);
  }
  return out;
}

// encoding_k3 _normalize_arguments + the argument channel of one call.
Status render_call(Builder& b, const ToolCall& call, int index) {
  b.open("call", {{"tool", call.name}, {"index", std::to_string(index)}});
  ojson args = ojson::object();
  bool fallback = false;
  if (!strip(call.arguments).empty()) {
    args = ojson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) {
      fallback = true;
    } else if (!args.is_object()) {
      return error(Code::invalid_argument,
                   "tool call '" + call.name + "': arguments must be a JSON object, got " + call.arguments);
    }
  }
  if (fallback) {
    b.open("json", {{"type", "object"}});
    b.text(call.arguments);
    b.close("json");
  } else {
    for (auto it = args.begin(); it != args.end(); ++it) {
      b.open("argument", {{"key", it.key()}, {"type", xtml_type(it.value())}});
      b.text(it.value().is_string() ? it.value().get<std::string>() : py_json_dumps(it.value(), false));
      b.close("argument");
    }
  }
  b.close("call");
  return ok_status();
}

}  // namespace

std::string xtml_escape_attr(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string xtml_unescape_attr(std::string_view v) {
  auto replace_all = [](std::string s, std::string_view from, std::string_view to) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
    return s;
  };
  return replace_all(replace_all(std::string(v), "&quot;", "\""), "&amp;", "&");
}

Result<std::unique_ptr<ChatTemplate>> K3Template::create(const Tokenizer& tok) {
  K3Markers m;
  K3_ASSIGN_OR_RETURN(m.open, require_special(tok, "<|open|>", "K3"));
  K3_ASSIGN_OR_RETURN(m.close, require_special(tok, "<|close|>", "K3"));
  K3_ASSIGN_OR_RETURN(m.sep, require_special(tok, "<|sep|>", "K3"));
  K3_ASSIGN_OR_RETURN(m.eom, require_special(tok, "<|end_of_msg|>", "K3"));
  return std::unique_ptr<ChatTemplate>(new K3Template(tok, m));
}

Result<std::vector<Segment>> K3Template::build(const std::vector<Message>& messages,
                                               const ChatOptions& options) const {
  K3_ASSIGN_OR_RETURN(std::string effort, validate_common(messages, options));
  Builder b{m_, {}};
  if (options.tools.is_array() && !options.tools.empty()) {
    b.internal_system("tool-declare", kToolDeclareHead + py_json_dumps(deep_sorted(options.tools), true) + "\n```");
  }
  if (!effort.empty()) b.internal_system("thinking-effort", kEffortText + effort + "`.");

  const std::vector<ToolCall>* prior_calls = nullptr;
  int tool_index = 0;
  for (const ToolResult& r : order_tool_results(messages)) {
    const Message& msg = *r.msg;
    if (msg.role == "system" || msg.role == "developer" || msg.role == "user") {
      std::vector<std::pair<std::string, std::string>> attrs = {{"role", msg.role == "user" ? "user" : "system"}};
      if (!msg.name.empty()) attrs.push_back({"name", msg.name});
      b.open("message", attrs);
      b.text(msg.content);
    } else if (msg.role == "assistant") {
      prior_calls = &msg.tool_calls;
      tool_index = 0;
      b.open("message", {{"role", "assistant"}});
      if (options.thinking) {
        b.open("think");
        if (!strip(msg.reasoning).empty()) b.text(msg.reasoning);
        b.close("think");
      }
      b.open("response");
      b.text(msg.content);
      b.close("response");
      if (!msg.tool_calls.empty()) {
        b.open("tools");
        for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
          K3_RETURN_IF_ERROR(render_call(b, msg.tool_calls[i], static_cast<int>(i) + 1));
        }
        b.close("tools");
      }
    } else {  // tool
      tool_index++;
      std::string name = !r.tool.empty() ? r.tool : msg.name;
      if (name.empty() && prior_calls && tool_index <= static_cast<int>(prior_calls->size())) {
        name = (*prior_calls)[tool_index - 1].name;
      }
      if (name.empty()) return error(Code::invalid_argument, "K3: a tool message has no resolvable tool name");
      b.open("message", {{"role", "tool"}, {"tool", name}, {"index", std::to_string(tool_index)}});
      b.text(msg.content);
    }
    b.close("message");
    b.eom();
  }

  std::string choice = options.tool_choice.is_string() ? options.tool_choice.get<std::string>() : "";
  if (choice == "required" || choice == "none") {
    b.internal_system("tool-choice", "The system is invoked with `tool_choice=" + choice + "`.\nYou MUST " +
                                         (choice == "required" ? "call tools" : "NOT call any tools") +
                                         " in the next message.");
  }

  const ojson& rf = options.response_format;
  std::string rf_type = rf.is_string() ? rf.get<std::string>()
                        : rf.is_object() && rf.contains("type") && rf["type"].is_string() ? rf["type"].get<std::string>()
                                                                                          : "";
  if (rf_type == "json_object") {
    b.internal_system("response-format",
                      std::string("The system is invoked with `response_format=json_object`.\n") + kRawJsonText);
  } else if (rf_type == "json_schema") {
    // schema = json_schema.schema, else json_schema.json_schema, else json_schema itself (null if absent).
    ojson schema;
    if (rf.is_object() && rf.contains("json_schema")) {
      const ojson& js = rf["json_schema"];
      schema = !js.is_object() ? js : js.contains("schema") ? js["schema"] : js.contains("json_schema") ? js["json_schema"] : js;
    }
    b.internal_system("response-format", std::string("The system is invoked with `response_format=json_schema`.\n") +
                                             kRawJsonText + "\nThe JSON data must match the following schema:\n```json\n" +
                                             py_json_dumps(deep_sorted(schema), true) + "\n```");
  }

  if (options.add_generation_prompt) {
    b.open("message", {{"role", "assistant"}});
    b.open(options.thinking ? "think" : "response");
  }
  return std::move(b.segs);
}

Result<std::vector<int32_t>> K3Template::render(const std::vector<Message>& messages,
                                                const ChatOptions& options) const {
  K3_ASSIGN_OR_RETURN(std::vector<Segment> segs, build(messages, options));
  return encode_segments(tok_, segs, /*merge_text=*/false);
}

Result<std::string> K3Template::render_text(const std::vector<Message>& messages, const ChatOptions& options) const {
  K3_ASSIGN_OR_RETURN(std::vector<Segment> segs, build(messages, options));
  return segments_text(segs);
}

std::unique_ptr<OutputParser> K3Template::make_parser(const ChatOptions& options) const {
  return make_k3_parser(tok_, m_, options);
}

bool K3Template::reasoning_ended(std::span<const int32_t> ids) const {
  // Scan markers left to right: OPEN|CLOSE, tag text tokens, SEP. The last "think" one decides.
  int last = 0;  // 0 none, 1 open, 2 close
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != m_.open && ids[i] != m_.close) continue;
    std::string tag;
    size_t j = i + 1;
    for (; j < ids.size() && !tok_.is_special(ids[j]) && tag.size() < 64; ++j) tag += tok_.token_bytes(ids[j]);
    if (j < ids.size() && ids[j] == m_.sep && strip(tag) == "think") last = ids[i] == m_.open ? 1 : 2;
  }
  return last == 2;
}

}  // namespace k3
