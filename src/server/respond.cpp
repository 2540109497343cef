// respond.cpp: response bodies and SSE chunks of a completion call (FORMATS.md §4.3-4.5, call.h).
//
// logprobs: one entry per generated token (reasoning and marker tokens included; a stop id is not a
// generated token), the log_softmax of the raw fp32 logits (the model's distribution, before bias,
// penalties, temperature and truncation). Chat: {token, logprob, bytes, top_logprobs[k]}; completions:
// {tokens, token_logprobs, top_logprobs (the k best plus the chosen token), text_offset}. Streaming sends
// each token's entry exactly once, with the next chunk of its choice (or its final chunk).
#include <httplib.h>

#include <cmath>

#include "server/call.h"

namespace k3::server {
namespace {

std::string finish_reason(const Choice& c) {
  if (!c.calls.empty()) return "tool_calls";
  if (c.stop_hit) return "stop";
  if (c.timed_out || c.why == FinishReason::length) return "length";
  return "stop";
}

ApiError engine_error(const Status& s) {
  if (s.ok())
    return {503, "the request was cancelled: the server is shutting down", "server_error", "",
            "server_shutting_down"};
  if (s.code() == Code::out_of_memory)
    return {400, "the request does not fit the KV cache: " + s.message(), "invalid_request_error", "",
            "context_length_exceeded"};
  return {500, s.message(), "server_error", "", "internal_error"};
}

int64_t cached_tokens(const Call& call) {
  int64_t n = 0;
  for (const Choice& c : call.choices)
    if (c.index % call.gen.n == 0) n += c.req->n_cached;  // once per prompt: its first choice
  return n;
}

json usage(const Call& call) {
  int64_t prompt = 0, gen = 0, reasoning = 0;
  for (const PromptInfo& p : call.prompts) prompt += int64_t(p.ids.size());
  for (const Choice& c : call.choices) {
    gen += int64_t(c.toks.size());
    if (c.parser) reasoning += c.parser->result().n_reasoning_tokens;
  }
  json u = {{"prompt_tokens", prompt},
            {"completion_tokens", gen},
            {"total_tokens", prompt + gen},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens(call)}}}};
  if (call.chat) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

double finite(float lp) {
  return std::isfinite(lp) ? double(lp) : -9999.0;  // OpenAI's stand-in for -inf
}

json token_entry(const Tokenizer& tok, int32_t id, float lp) {
  const std::string raw = tok.token_bytes(id);
  json bytes = json::array();
  for (char ch : raw) bytes.push_back(int(static_cast<unsigned char>(ch)));
  return {{"token", utf8_sanitize(raw)}, {"logprob", finite(lp)}, {"bytes", bytes}};
}

// Logprobs of c.toks[from, to), or null when not asked for.
json logprobs_json(const SessionEnv& env, const Call& call, const Choice& c, size_t from, size_t to) {
  if (!call.gen.logprobs) return nullptr;
  if (call.chat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      json e = token_entry(env.tok, c.toks[i].id, c.toks[i].logprob);
      e["top_logprobs"] = json::array();
      for (const TokenLogprob& t : c.toks[i].top)
        e["top_logprobs"].push_back(token_entry(env.tok, t.id, t.logprob));
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = from; i < to; ++i) {
    const OutToken& t = c.toks[i];
    tokens.push_back(utf8_sanitize(env.tok.token_bytes(t.id)));
    lps.push_back(finite(t.logprob));
    json top = json::object();
    for (const TokenLogprob& a : t.top) top[utf8_sanitize(env.tok.token_bytes(a.id))] = finite(a.logprob);
    top[utf8_sanitize(env.tok.token_bytes(t.id))] = finite(t.logprob);  // the chosen token, always
    tops.push_back(std::move(top));
    offs.push_back(t.offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json tool_call_json(const ToolCall& t, int index, bool stream) {
  json j = {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
  if (stream) j["index"] = index;
  return j;
}

json envelope(const SessionEnv& env, const Call& call, json choices, bool chunk) {
  return {{"id", call.id},
          {"object", call.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", env.created},
          {"model", env.model_id},
          {"system_fingerprint", nullptr},
          {"choices", std::move(choices)}};
}

json chunk(const SessionEnv& env, const Call& call, int index, json delta, json finish, json logprobs) {
  json ch;
  if (call.chat)
    ch = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish}};
  else
    ch = {{"index", index},
          {"text", delta.value("content", "")},
          {"logprobs", logprobs},
          {"finish_reason", finish}};
  json c = envelope(env, call, json::array({ch}), true);
  if (call.gen.include_usage) c["usage"] = nullptr;
  return c;
}

std::vector<json> deltas(const std::vector<ChatEvent>& out, int* n_calls) {
  std::vector<json> d;
  for (const ChatEvent& e : out) {
    if (e.kind == ChatEvent::Kind::reasoning)
      d.push_back({{"reasoning_content", e.text}, {"reasoning", e.text}});
    else if (e.kind == ChatEvent::Kind::content)
      d.push_back({{"content", e.text}});
    else {
      const int k = (*n_calls)++;
      json head = tool_call_json(e.call, k, true);
      head["function"]["arguments"] = "";
      d.push_back({{"tool_calls", json::array({head})}});
      d.push_back(
          {{"tool_calls", json::array({{{"index", k}, {"function", {{"arguments", e.call.arguments}}}}})}});
    }
  }
  return d;
}

}  // namespace

void respond_whole(const SessionEnv& env, Call& call, httplib::Response& res) {
  for (bool all_done = false; !all_done;) {
    all_done = true;
    for (Choice& c : call.choices) {
      std::vector<ChatEvent> out;
      poll(env, call, c, out, all_done ? 50 : 0);
      all_done = all_done && c.done;
    }
    if (all_done) break;
    check_deadline(env, call);
    if (env.client_gone && env.client_gone()) {  // nobody to answer: stop computing, free the pages
      for (Choice& c : call.choices) c.req->cancelled = true;
      env.metrics.disconnects++;
      res.status = 499;
      return;
    }
  }
  env.metrics.cached_tokens += cached_tokens(call);
  for (const Choice& c : call.choices)
    if (failed(c)) {
      env.metrics.errors++;
      ApiError e = engine_error(c.err);
      res.status = e.http;
      res.set_content(dump(error_body(e)), "application/json");
      return;
    }
  json choices = json::array();
  for (const Choice& c : call.choices) {
    json lp = logprobs_json(env, call, c, 0, c.toks.size());
    json ch;
    if (call.chat) {
      json msg = {{"role", "assistant"}, {"content", c.content}};
      if (c.content.empty() && !c.calls.empty()) msg["content"] = nullptr;
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning, msg["reasoning"] = c.reasoning;
      if (!c.calls.empty()) {
        msg["tool_calls"] = json::array();
        for (size_t k = 0; k < c.calls.size(); ++k)
          msg["tool_calls"].push_back(tool_call_json(c.calls[k], int(k), false));
      }
      ch = {{"index", c.index}, {"message", msg}, {"logprobs", lp}, {"finish_reason", finish_reason(c)}};
    } else {
      ch = {{"index", c.index},
            {"text", call.prompts[size_t(c.prompt)].echo + c.content},
            {"logprobs", lp},
            {"finish_reason", finish_reason(c)}};
      if (call.gen.return_token_ids) ch["prompt_token_ids"] = call.prompts[size_t(c.prompt)].ids;
    }
    if (call.gen.return_token_ids) {
      std::vector<int32_t> ids;
      for (const OutToken& t : c.toks) ids.push_back(t.id);
      ch["token_ids"] = ids;
    }
    choices.push_back(std::move(ch));
  }
  json body = envelope(env, call, std::move(choices), false);
  body["usage"] = usage(call);
  if (call.chat && call.gen.return_token_ids) body["prompt_token_ids"] = call.prompts[0].ids;
  res.status = 200;
  res.set_content(dump(body), "application/json");
}

void respond_stream(const SessionEnv& env, std::shared_ptr<Call> call, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  SessionEnv e = env;
  e.client_gone = nullptr;  // a stream notices a client that left when a write fails
  res.set_chunked_content_provider(
      "text/event-stream",
      [e, call](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string s = "data: " + dump(j) + "\n\n";
          return sink.write(s.data(), s.size());
        };
        auto gone = [&] {
          e.metrics.disconnects++;
          return false;
        };
        std::vector<int> n_calls(call->choices.size(), 0);
        for (Choice& c : call->choices) {
          const std::string& echo = call->prompts[size_t(c.prompt)].echo;
          json first = call->chat ? json{{"role", "assistant"}, {"content", ""}} : json{{"content", echo}};
          if ((call->chat || !echo.empty()) && !send(chunk(e, *call, c.index, first, nullptr, nullptr)))
            return gone();
        }
        for (bool all_done = false; !all_done;) {
          all_done = true;
          for (Choice& c : call->choices) {
            if (c.done) continue;
            std::vector<ChatEvent> out;
            poll(e, *call, c, out, 10);
            for (json& d : deltas(out, &n_calls[size_t(c.index)])) {
              json lp = c.toks_sent < c.toks.size() ? logprobs_json(e, *call, c, c.toks_sent, c.toks.size())
                                                    : json(nullptr);
              c.toks_sent = c.toks.size();
              if (!send(chunk(e, *call, c.index, std::move(d), nullptr, std::move(lp)))) return gone();
            }
            if (!c.done) {
              all_done = false;
              continue;
            }
            if (failed(c)) {
              e.metrics.errors++;
              if (!send(error_body(engine_error(c.err)))) return gone();
              continue;
            }
            json lp = logprobs_json(e, *call, c, c.toks_sent, c.toks.size());
            c.toks_sent = c.toks.size();
            if (!send(chunk(e, *call, c.index, json::object(), finish_reason(c), std::move(lp))))
              return gone();
          }
          check_deadline(e, *call);
          if (!all_done && sink.is_writable && !sink.is_writable()) return gone();
        }
        e.metrics.cached_tokens += cached_tokens(*call);
        if (call->gen.include_usage) {
          json u = envelope(e, *call, json::array(), true);
          u["usage"] = usage(*call);
          if (!send(u)) return gone();
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      },
      [call](bool) {  // the response is gone (finished or the client left): nothing more to compute
        for (Choice& c : call->choices) c.req->cancelled = true;
      });
}

}  // namespace k3::server
