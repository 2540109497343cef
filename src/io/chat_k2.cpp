// chat_k2.cpp: K2 `<|im_*|>` prompt rendering (FORMATS.md §2.1).
#include "io/chat_k2.h"

#include <map>

namespace k3 {

namespace {

constexpr const char* kDefaultSystem = "You are Kimi, an AI assistant created by Moonshot AI.";

// "functions.{name}:{digits}" as the model was trained to emit it.
bool is_canonical_id(const std::string& id) {
  if (id.rfind("functions.", 0) != 0) return false;
  size_t colon = id.rfind(':');
  if (colon == std::string::npos || colon + 1 == id.size() || colon <= 10) return false;
  for (size_t i = colon + 1; i < id.size(); ++i) if (!std::isdigit(static_cast<unsigned char>(id[i]))) return false;
  return true;
}

}  // namespace

std::string k2_tool_name_from_id(std::string_view id) {
  std::string_view head = id.substr(0, id.find(':'));
  size_t dot = head.rfind('.');
  return std::string(dot == std::string_view::npos ? head : head.substr(dot + 1));
}

Result<std::unique_ptr<ChatTemplate>> K2Template::create(const Tokenizer& tok, bool think_variant) {
  K2Markers m;
  K3_ASSIGN_OR_RETURN(m.im_user, require_special(tok, "<|im_user|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.im_assistant, require_special(tok, "<|im_assistant|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.im_system, require_special(tok, "<|im_system|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.im_middle, require_special(tok, "<|im_middle|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.im_end, require_special(tok, "<|im_end|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.section_begin, require_special(tok, "<|tool_calls_section_begin|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.section_end, require_special(tok, "<|tool_calls_section_end|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.call_begin, require_special(tok, "<|tool_call_begin|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.call_arg_begin, require_special(tok, "<|tool_call_argument_begin|>", "K2"));
  K3_ASSIGN_OR_RETURN(m.call_end, require_special(tok, "<|tool_call_end|>", "K2"));
  m.think_open = tok.special_id("<think>");
  m.think_close = tok.special_id("</think>");
  m.section_begin_singular = tok.special_id("<|tool_call_section_begin|>");
  if (think_variant && (!m.think_open || !m.think_close)) {
    return error(Code::not_found, "K2 thinking format: the tokenizer has no <think> / </think> special tokens");
  }
  return std::unique_ptr<ChatTemplate>(new K2Template(tok, m, think_variant));
}

Result<std::vector<Segment>> K2Template::build(const std::vector<Message>& messages,
                                               const ChatOptions& options) const {
  K3_RETURN_IF_ERROR(validate_common(messages, options).status());
  std::vector<Segment> segs;
  auto mark = [&](int32_t id, const char* name) { segs.push_back({id, name}); };
  auto text = [&](std::string s) {
    if (!s.empty()) segs.push_back({-1, std::move(s)});
  };
  auto head = [&](int32_t id, const char* marker, const std::string& name) {
    mark(id, marker);
    text(name);
    mark(m_.im_middle, "<|im_middle|>");
  };
  auto end = [&] { mark(m_.im_end, "<|im_end|>"); };

  if (options.tools.is_array() && !options.tools.empty()) {
    head(m_.im_system, "<|im_system|>", "tool_declare");
    text(py_json_dumps(options.tools, /*compact=*/true));
    end();
  }
  // Think variant: reasoning is kept only after the last assistant message without tool calls.
  int last_plain_assistant = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "assistant" && messages[i].tool_calls.empty()) last_plain_assistant = static_cast<int>(i);
  }

  std::map<std::string, std::string> call_ids;   // client id -> rendered id, for the latest assistant
  std::vector<std::string> rendered_ids;         // of the latest assistant, by position
  size_t n_tool = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& msg = messages[i];
    bool is_system = msg.role == "system" || msg.role == "developer";
    if (i == 0 && !is_system) {
      head(m_.im_system, "<|im_system|>", "system");
      text(kDefaultSystem);
      end();
    }
    std::string role = is_system ? "system" : msg.role;
    std::string name = msg.name.empty() ? role : msg.name;
    if (msg.role == "user") {
      head(m_.im_user, "<|im_user|>", name);
      text(msg.content);
    } else if (msg.role == "assistant") {
      head(m_.im_assistant, "<|im_assistant|>", name);
      if (think_) {
        mark(*m_.think_open, "<think>");
        if (static_cast<int>(i) > last_plain_assistant) text(msg.reasoning);
        mark(*m_.think_close, "</think>");
      }
      text(msg.content);
      call_ids.clear();
      rendered_ids.clear();
      n_tool = 0;
      if (!msg.tool_calls.empty()) {
        mark(m_.section_begin, "<|tool_calls_section_begin|>");
        for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
          const ToolCall& c = msg.tool_calls[k];
          std::string id = is_canonical_id(c.id) ? c.id : "functions." + c.name + ":" + std::to_string(k);
          call_ids.emplace(c.id, id);
          call_ids.emplace(c.name + ":" + std::to_string(k), id);
          rendered_ids.push_back(id);
          mark(m_.call_begin, "<|tool_call_begin|>");
          text(id);
          mark(m_.call_arg_begin, "<|tool_call_argument_begin|>");
          text(c.arguments);
          mark(m_.call_end, "<|tool_call_end|>");
        }
        mark(m_.section_end, "<|tool_calls_section_end|>");
      }
    } else if (msg.role == "tool") {
      // validate_common guarantees the id matches a call, or that a positional call exists.
      std::string id = msg.tool_call_id.empty() ? rendered_ids[n_tool] : call_ids.at(msg.tool_call_id);
      n_tool++;
      head(m_.im_system, "<|im_system|>", msg.name.empty() ? "tool" : msg.name);
      text("## Return of " + id + "\n" + msg.content);
    } else {
      head(m_.im_system, "<|im_system|>", name);
      text(msg.content);
    }
    end();
  }

  if (options.add_generation_prompt) {
    head(m_.im_assistant, "<|im_assistant|>", "assistant");
    if (think_) {
      mark(*m_.think_open, "<think>");
      if (!options.thinking) mark(*m_.think_close, "</think>");
    }
  }
  return segs;
}

Result<std::vector<int32_t>> K2Template::render(const std::vector<Message>& messages,
                                                const ChatOptions& options) const {
  K3_ASSIGN_OR_RETURN(std::vector<Segment> segs, build(messages, options));
  return encode_segments(tok_, segs, /*merge_text=*/true);
}

Result<std::string> K2Template::render_text(const std::vector<Message>& messages, const ChatOptions& options) const {
  K3_ASSIGN_OR_RETURN(std::vector<Segment> segs, build(messages, options));
  return segments_text(segs);
}

std::unique_ptr<OutputParser> K2Template::make_parser(const ChatOptions& options) const {
  return make_k2_parser(tok_, m_, think_ && options.thinking);
}

}  // namespace k3
