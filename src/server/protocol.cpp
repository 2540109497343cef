// protocol.cpp: request parsing and validation (protocol.h).
#include "server/protocol.h"

#include <cstdio>
#include <random>

namespace k3::server {

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

namespace {

ApiError bad(const std::string& param, const std::string& msg) {
  return {400, msg, "invalid_request_error", param, ""};
}

// Optional typed fields: absent or null -> untouched.
std::optional<ApiError> get_number(const json& b, const char* key, double lo, double hi, float* out) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number()) return bad(key, std::string("'") + key + "' must be a number");
  const double v = b[key].get<double>();
  if (!(v >= lo && v <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    return bad(key, std::string("'") + key + "' must be in " + range);
  }
  *out = float(v);
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& b, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_number_integer()) return bad(key, std::string("'") + key + "' must be an integer");
  const int64_t v = b[key].get<int64_t>();
  if (v < lo || v > hi)
    return bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& b, const char* key, bool* out) {
  if (!b.contains(key) || b[key].is_null()) return std::nullopt;
  if (!b[key].is_boolean()) return bad(key, std::string("'") + key + "' must be a boolean");
  *out = b[key].get<bool>();
  return std::nullopt;
}

#define K3_TRY(expr) \
  if (auto e_ = (expr)) return e_;

std::optional<ApiError> parse_gen(const json& b, int32_t n_vocab, GenParams* g) {
  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return bad("model", "'model' must be a string");
    g->model = b["model"].get<std::string>();
  }
  int64_t v = -1;
  K3_TRY(get_int(b, "max_tokens", 1, 1 << 30, &v));
  K3_TRY(get_int(b, "max_completion_tokens", 1, 1 << 30, &v));
  g->max_tokens = int(v);
  v = 1;
  K3_TRY(get_int(b, "n", 1, 16, &v));
  g->n = int(v);
  SamplerParams& s = g->sampling;
  s.temperature = 1.0f;
  K3_TRY(get_number(b, "temperature", 0, 2, &s.temperature));
  K3_TRY(get_number(b, "top_p", 1e-9, 1, &s.top_p));
  K3_TRY(get_number(b, "min_p", 0, 1, &s.min_p));
  K3_TRY(get_number(b, "presence_penalty", -2, 2, &s.presence_penalty));
  K3_TRY(get_number(b, "frequency_penalty", -2, 2, &s.frequency_penalty));
  K3_TRY(get_number(b, "repetition_penalty", 1e-6, 100, &s.repeat_penalty));
  v = 0;
  K3_TRY(get_int(b, "top_k", -1, n_vocab, &v));
  s.top_k = int(std::max<int64_t>(v, 0));
  s.repeat_last_n = -1;
  if (b.contains("seed") && !b["seed"].is_null()) {
    if (!b["seed"].is_number_integer()) return bad("seed", "'seed' must be an integer");
    s.seed = uint64_t(b["seed"].get<int64_t>());
    g->seed_given = true;
  } else {
    s.seed = std::random_device{}();
  }
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    if (!b["logit_bias"].is_object())
      return bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto& [k, val] : b["logit_bias"].items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end || id < 0 || id >= n_vocab || !val.is_number())
        return bad("logit_bias", "'logit_bias' key '" + k + "' is not a token id with a numeric bias");
      s.logit_bias.push_back({int32_t(id), std::clamp(val.get<float>(), -100.f, 100.f)});
    }
  }
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& st = b["stop"];
    if (st.is_string())
      g->stop.push_back(st.get<std::string>());
    else if (st.is_array() && st.size() <= 4 &&
             std::all_of(st.begin(), st.end(), [](const json& x) { return x.is_string(); }))
      for (const json& x : st) g->stop.push_back(x.get<std::string>());
    else
      return bad("stop", "'stop' must be a string or a list of at most 4 strings");
  }
  if (b.contains("stop_token_ids") && !b["stop_token_ids"].is_null()) {
    const json& st = b["stop_token_ids"];
    if (!st.is_array()) return bad("stop_token_ids", "'stop_token_ids' must be a list of token ids");
    for (const json& x : st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n_vocab)
        return bad("stop_token_ids", "'stop_token_ids' holds a value that is not a token id");
      g->stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  K3_TRY(get_bool(b, "ignore_eos", &g->ignore_eos));
  K3_TRY(get_bool(b, "return_token_ids", &g->return_token_ids));
  K3_TRY(get_bool(b, "stream", &g->stream));
  if (b.contains("stream_options") && b["stream_options"].is_object())
    K3_TRY(get_bool(b["stream_options"], "include_usage", &g->include_usage));
  if (b.contains("suffix") && !b["suffix"].is_null())
    return bad("suffix", "'suffix' is not supported: these models have no fill-in-the-middle format");
  Status sv = validate(s, n_vocab);
  if (!sv.ok()) return bad("", sv.message());
  return std::nullopt;
}

std::optional<ApiError> text_of(const json& c, const std::string& where, std::string* out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (c.is_array()) {
    for (const json& part : c) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        return bad(where, where + " parts must be objects with a 'type'");
      if (part["type"] != "text") return bad(where, where + ": only text parts are supported");
      if (!part.contains("text") || !part["text"].is_string())
        return bad(where, where + ": a text part needs 'text'");
      *out += part["text"].get<std::string>();
    }
    return std::nullopt;
  }
  return bad(where, where + " must be a string, null or a list of text parts");
}

std::optional<ApiError> parse_message(const json& m, size_t i, Message* out) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return bad(at, at + " must be an object");
  if (!m.contains("role") || !m["role"].is_string()) return bad(at + ".role", at + ".role must be a string");
  out->role = m["role"].get<std::string>();
  if (m.contains("content")) K3_TRY(text_of(m["content"], at + ".content", &out->content));
  for (const char* k : {"name", "tool_call_id"})
    if (m.contains(k) && !m[k].is_null()) {
      if (!m[k].is_string()) return bad(at + "." + k, at + "." + k + " must be a string");
      (std::string(k) == "name" ? out->name : out->tool_call_id) = m[k].get<std::string>();
    }
  for (const char* k : {"reasoning_content", "reasoning"})
    if (m.contains(k) && m[k].is_string() && out->reasoning.empty()) out->reasoning = m[k].get<std::string>();
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (!m["tool_calls"].is_array()) return bad(at + ".tool_calls", at + ".tool_calls must be a list");
    for (const json& tc : m["tool_calls"]) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
          !tc["function"].contains("name") || !tc["function"]["name"].is_string())
        return bad(at + ".tool_calls", at + ".tool_calls entries need function.name");
      ToolCall call;
      if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"].get<std::string>();
      call.name = tc["function"]["name"].get<std::string>();
      const json& args = tc["function"].value("arguments", json("{}"));
      call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
      out->tool_calls.push_back(call);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat(const json& b, int32_t n_vocab, ChatRequest* out) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  K3_TRY(parse_gen(b, n_vocab, &out->gen));
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    return bad("messages", "'messages' must be a non-empty list");
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    Message m;
    K3_TRY(parse_message(b["messages"][i], i, &m));
    out->messages.push_back(std::move(m));
  }
  GenParams& g = out->gen;
  K3_TRY(get_bool(b, "logprobs", &g.logprobs));
  int64_t top = 0;
  K3_TRY(get_int(b, "top_logprobs", 0, 20, &top));
  if (top > 0 && !g.logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  g.top_logprobs = int(top);
  g.sampling.n_top_logprobs = g.top_logprobs;
  ChatOptions& o = out->options;
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) return bad("tools", "'tools' must be a list");
    o.tools = ojson::parse(b["tools"].dump());
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null())
    o.tool_choice = ojson::parse(b["tool_choice"].dump());
  if (b.contains("response_format") && !b["response_format"].is_null())
    o.response_format = ojson::parse(b["response_format"].dump());
  if (b.contains("reasoning_effort") && b["reasoning_effort"].is_string()) {
    std::string e = b["reasoning_effort"].get<std::string>();
    if (e == "none")
      o.thinking = false;
    else
      o.thinking_effort = e == "minimal" ? "low" : e == "medium" ? "high" : e;
  }
  if (b.contains("chat_template_kwargs") && b["chat_template_kwargs"].is_object()) {
    const json& k = b["chat_template_kwargs"];
    K3_TRY(get_bool(k, "enable_thinking", &o.thinking));
    K3_TRY(get_bool(k, "thinking", &o.thinking));
    if (k.contains("thinking_effort") && k["thinking_effort"].is_string())
      o.thinking_effort = k["thinking_effort"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion(const json& b, int32_t n_vocab, CompletionRequest* out) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  K3_TRY(parse_gen(b, n_vocab, &out->gen));
  if (!b.contains("prompt")) return bad("prompt", "'prompt' is required");
  const json& p = b["prompt"];
  auto ids_of = [&](const json& x, CompletionPrompt* cp) -> std::optional<ApiError> {
    std::vector<int32_t> ids;
    for (const json& t : x) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
        return bad("prompt", "'prompt' holds a value that is not a token id");
      ids.push_back(t.get<int32_t>());
    }
    cp->ids = std::move(ids);
    return std::nullopt;
  };
  const char* shape = "'prompt' must be a string, a list of token ids, or a non-empty list of those";
  if (p.is_string()) {
    out->prompts.push_back({p.get<std::string>(), std::nullopt});
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {  // one prompt of ids
    out->prompts.emplace_back();
    K3_TRY(ids_of(p, &out->prompts.back()));
  } else if (p.is_array() && !p.empty()) {  // a list of prompts
    for (const json& x : p) {
      out->prompts.emplace_back();
      if (x.is_string()) {
        out->prompts.back().text = x.get<std::string>();
      } else if (x.is_array() && !x.empty()) {
        K3_TRY(ids_of(x, &out->prompts.back()));
      } else {
        return bad("prompt", shape);
      }
    }
  } else {
    return bad("prompt", shape);
  }
  if (int64_t(out->prompts.size()) * out->gen.n > kMaxChoices)
    return bad("n", "prompts x n must be at most " + std::to_string(kMaxChoices));
  if (b.contains("logprobs") && !b["logprobs"].is_null()) {
    if (b["logprobs"].is_boolean()) return bad("logprobs", "'logprobs' must be an integer in [0, 5]");
    int64_t k = 0;
    K3_TRY(get_int(b, "logprobs", 0, 5, &k));
    out->gen.logprobs = true;
    out->gen.top_logprobs = int(k);
    out->gen.sampling.n_top_logprobs = int(k);
  }
  K3_TRY(get_bool(b, "echo", &out->echo));
  if (out->echo && out->gen.logprobs)
    return bad("echo", "'echo' with 'logprobs' is not supported: prompt log-probabilities are not computed");
  if (out->gen.max_tokens < 0) out->gen.max_tokens = 16;  // OpenAI's default [decision, FORMATS §4.5]
  return std::nullopt;
}

}  // namespace k3::server
