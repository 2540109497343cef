// session.cpp: one completion call end to end (session.h).
#include "server/session.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>

#include "engine/generate.h"
#include "server/protocol.h"

namespace k3::server {

void Metrics::observe_ttft(double s) {
  static const double le[5] = {0.1, 0.5, 1, 5, 30};
  for (int i = 0; i < 5; ++i)
    if (s <= le[i]) ttft_le[i]++;
  ttft_le[5]++;
  ttft_count++;
  ttft_sum = ttft_sum + s;
}

std::string Metrics::prometheus() const {
  std::string o;
  auto line = [&](const char* name, const char* type, const char* help, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(v) + "\n";
  };
  line("k3_requests_total", "counter", "Completion requests received.", requests);
  line("k3_request_errors_total", "counter", "Requests answered with an error.", errors);
  line("k3_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", prompt_tokens);
  line("k3_generation_tokens_total", "counter", "Generated tokens.", generated_tokens);
  line("k3_cache_hit_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
       cached_tokens);
  line("k3_requests_running", "gauge", "Requests being computed.", running);
  line("k3_requests_waiting", "gauge", "Requests in the queue.", waiting);
  line("k3_pool_pages_used", "gauge", "Cache pages held by running requests.", pages_used);
  line("k3_pool_pages_cached", "gauge", "Cache pages kept for prefix reuse (evictable).", pages_cached);
  line("k3_pool_pages_total", "gauge", "Cache pages in the pool.", pages_total);
  o += "# HELP k3_time_to_first_token_seconds Time from submission to the first generated token.\n"
       "# TYPE k3_time_to_first_token_seconds histogram\n";
  const char* le[6] = {"0.1", "0.5", "1", "5", "30", "+Inf"};
  for (int i = 0; i < 6; ++i)
    o += std::string("k3_time_to_first_token_seconds_bucket{le=\"") + le[i] + "\"} " +
         std::to_string(ttft_le[i]) + "\n";
  o += "k3_time_to_first_token_seconds_sum " + std::to_string(ttft_sum.load()) + "\n";
  o += "k3_time_to_first_token_seconds_count " + std::to_string(ttft_count.load()) + "\n";
  return o;
}

namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  bool done = false;
  int32_t id = -1;
  FinishReason why = FinishReason::aborted;
  Status err;
};

class Channel {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  bool pop(Event* e, int wait_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !q_.empty(); })) return false;
    *e = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

struct Choice {
  int index = 0;
  std::shared_ptr<Request> req;
  std::shared_ptr<Channel> ch = std::make_shared<Channel>();
  std::unique_ptr<OutputParser> parser;  // chat
  std::unique_ptr<StreamDecoder> dec;    // completions
  std::unique_ptr<StopMatcher> stop;
  int n_tokens = 0;
  bool done = false, stop_hit = false;
  FinishReason why = FinishReason::aborted;
  Status err;
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  Clock::time_point t0 = Clock::now();
};

struct Call {
  bool chat = true;
  bool stream = false, include_usage = false;
  std::string id;
  int64_t n_prompt = 0;
  std::string echo;  // completions: text put before the output
  std::vector<Choice> choices;
};

void emit(Choice& c, ChatEvent::Kind kind, std::string t, std::vector<ChatEvent>& out) {
  if (t.empty()) return;
  (kind == ChatEvent::Kind::reasoning ? c.reasoning : c.content) += t;
  if (!out.empty() && out.back().kind == kind)
    out.back().text += t;
  else
    out.push_back({kind, std::move(t), {}, 0});
}

void on_chat_events(Choice& c, std::vector<ChatEvent>& ev, std::vector<ChatEvent>& out) {
  for (ChatEvent& e : ev) {
    if (c.stop->stopped()) break;
    if (e.kind == ChatEvent::Kind::content) {
      emit(c, e.kind, c.stop->push(e.text), out);
      if (c.stop->stopped()) c.stop_hit = true, c.req->cancelled = true;
    } else if (e.kind == ChatEvent::Kind::reasoning) {
      emit(c, e.kind, e.text, out);
    } else {
      c.calls.push_back(e.call);
      out.push_back(e);
    }
  }
}

// Takes what arrived for c (waiting up to wait_ms), appending client-visible events to `out`.
void poll(Choice& c, bool chat, std::vector<ChatEvent>& out, int wait_ms, Metrics& m) {
  Event e;
  while (!c.done && c.ch->pop(&e, wait_ms)) {
    wait_ms = 0;
    if (!e.done) {
      if (c.stop_hit) continue;
      if (c.n_tokens++ == 0) m.observe_ttft(std::chrono::duration<double>(Clock::now() - c.t0).count());
      m.generated_tokens++;
      if (chat) {
        std::vector<ChatEvent> ev;
        c.parser->push(e.id, ev);
        on_chat_events(c, ev, out);
      } else {
        emit(c, ChatEvent::Kind::content, c.stop->push(c.dec->push(e.id)), out);
        if (c.stop->stopped()) c.stop_hit = true, c.req->cancelled = true;
      }
      continue;
    }
    c.done = true;
    c.why = e.why;
    c.err = e.err;
    if (chat) {
      std::vector<ChatEvent> ev;
      c.parser->finish(ev);
      on_chat_events(c, ev, out);
    } else if (!c.stop->stopped()) {
      emit(c, ChatEvent::Kind::content, c.stop->push(c.dec->flush()), out);
    }
    if (!c.stop->stopped()) emit(c, ChatEvent::Kind::content, c.stop->flush(), out);
  }
}

bool failed(const Choice& c) {
  return c.done && !c.stop_hit && c.why == FinishReason::aborted && !c.err.ok();
}

std::string finish_reason(const Choice& c) {
  if (!c.calls.empty()) return "tool_calls";
  if (c.stop_hit || c.why != FinishReason::length) return "stop";
  return "length";
}

ApiError engine_error(const Status& s) {
  if (s.code() == Code::out_of_memory)
    return {400, "the request does not fit the KV cache: " + s.message(), "invalid_request_error", "",
            "context_length_exceeded"};
  return {500, s.message(), "server_error", "", "internal_error"};
}

json usage(const Call& call) {
  int64_t gen = 0, reasoning = 0;
  for (const Choice& c : call.choices) {
    gen += c.n_tokens;
    if (c.parser) reasoning += c.parser->result().n_reasoning_tokens;
  }
  json u = {{"prompt_tokens", call.n_prompt},
            {"completion_tokens", gen},
            {"total_tokens", call.n_prompt + gen},
            {"prompt_tokens_details", {{"cached_tokens", call.choices[0].req->n_cached}}}};
  if (call.chat) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

json tool_call_json(const ToolCall& t, int index, bool stream) {
  json j = {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
  if (stream) j["index"] = index;
  return j;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json chunk(const SessionEnv& env, const Call& call, int index, json delta, json finish) {
  json ch;
  if (call.chat)
    ch = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}};
  else
    ch = {{"index", index},
          {"text", delta.value("content", "")},
          {"logprobs", nullptr},
          {"finish_reason", finish}};
  json c = {{"id", call.id},
            {"object", call.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", env.created},
            {"model", env.model_id},
            {"system_fingerprint", nullptr},
            {"choices", json::array({ch})}};
  if (call.include_usage) c["usage"] = nullptr;
  return c;
}

std::vector<json> deltas(const std::vector<ChatEvent>& out, std::vector<int>* n_calls) {
  std::vector<json> d;
  for (const ChatEvent& e : out) {
    if (e.kind == ChatEvent::Kind::reasoning)
      d.push_back({{"reasoning_content", e.text}, {"reasoning", e.text}});
    else if (e.kind == ChatEvent::Kind::content)
      d.push_back({{"content", e.text}});
    else {
      const int k = (*n_calls)[0]++;
      json head = tool_call_json(e.call, k, true);
      head["function"]["arguments"] = "";
      d.push_back({{"tool_calls", json::array({head})}});
      d.push_back(
          {{"tool_calls", json::array({{{"index", k}, {"function", {{"arguments", e.call.arguments}}}}})}});
    }
  }
  return d;
}

void respond_whole(const SessionEnv& env, Call& call, httplib::Response& res) {
  for (Choice& c : call.choices) {
    std::vector<ChatEvent> out;
    while (!c.done) poll(c, call.chat, out, 100, env.metrics);
  }
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
    if (call.chat) {
      json msg = {{"role", "assistant"}, {"content", c.content}};
      if (c.content.empty() && !c.calls.empty()) msg["content"] = nullptr;
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning, msg["reasoning"] = c.reasoning;
      if (!c.calls.empty()) {
        msg["tool_calls"] = json::array();
        for (size_t k = 0; k < c.calls.size(); ++k)
          msg["tool_calls"].push_back(tool_call_json(c.calls[k], int(k), false));
      }
      choices.push_back(
          {{"index", c.index}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_reason(c)}});
    } else {
      choices.push_back({{"index", c.index},
                         {"text", call.echo + c.content},
                         {"logprobs", nullptr},
                         {"finish_reason", finish_reason(c)}});
    }
  }
  json body = {{"id", call.id},
               {"object", call.chat ? "chat.completion" : "text_completion"},
               {"created", env.created},
               {"model", env.model_id},
               {"system_fingerprint", nullptr},
               {"choices", choices},
               {"usage", usage(call)}};
  res.status = 200;
  res.set_content(dump(body), "application/json");
}

void respond_stream(const SessionEnv& env, std::shared_ptr<Call> call, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  SessionEnv e = env;
  res.set_chunked_content_provider(
      "text/event-stream",
      [e, call](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string s = "data: " + dump(j) + "\n\n";
          return sink.write(s.data(), s.size());
        };
        std::vector<int> n_calls(call->choices.size(), 0);
        for (Choice& c : call->choices) {
          json first =
              call->chat ? json{{"role", "assistant"}, {"content", ""}} : json{{"content", call->echo}};
          if ((call->chat || !call->echo.empty()) && !send(chunk(e, *call, c.index, first, nullptr)))
            return false;
        }
        for (bool all_done = false; !all_done;) {
          all_done = true;
          for (Choice& c : call->choices) {
            if (c.done) continue;
            std::vector<ChatEvent> out;
            poll(c, call->chat, out, 10, e.metrics);
            std::vector<int> k(1, n_calls[size_t(c.index)]);
            for (json& d : deltas(out, &k))
              if (!send(chunk(e, *call, c.index, std::move(d), nullptr))) return false;
            n_calls[size_t(c.index)] = k[0];
            if (!c.done) {
              all_done = false;
              continue;
            }
            if (failed(c)) {
              e.metrics.errors++;
              if (!send(error_body(engine_error(c.err)))) return false;
            } else if (!send(chunk(e, *call, c.index, json::object(), finish_reason(c)))) {
              return false;
            }
          }
          if (!all_done && sink.is_writable && !sink.is_writable()) return false;
        }
        if (call->include_usage) {
          json u = {{"id", call->id},
                    {"object", call->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", e.created},
                    {"model", e.model_id},
                    {"system_fingerprint", nullptr},
                    {"choices", json::array()},
                    {"usage", usage(*call)}};
          if (!send(u)) return false;
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

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 gen(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[gen() % 16];
  return s;
}

}  // namespace

void run_session(const SessionEnv& env, bool chat, const json& body, httplib::Response& res) {
  auto fail = [&](const ApiError& e) {
    env.metrics.errors++;
    res.status = e.http;
    res.set_content(dump(error_body(e)), "application/json");
  };
  GenParams gen;
  std::vector<int32_t> prompt;
  auto call = std::make_shared<Call>();
  call->chat = chat;
  ChatOptions chat_opts;
  if (chat) {
    ChatRequest cr;
    if (auto e = parse_chat(body, env.cfg.n_vocab, &cr)) return fail(*e);
    gen = cr.gen;
    chat_opts = cr.options;
    if (!gen.model.empty() && gen.model != env.model_id)
      return fail({404, "the model '" + gen.model + "' does not exist", "invalid_request_error", "model",
                   "model_not_found"});
    auto ids = env.tmpl.render(cr.messages, cr.options);
    if (!ids.ok()) return fail({400, ids.status().message(), "invalid_request_error", "messages", ""});
    prompt = std::move(ids).value();
  } else {
    CompletionRequest cr;
    if (auto e = parse_completion(body, env.cfg.n_vocab, &cr)) return fail(*e);
    gen = cr.gen;
    if (!gen.model.empty() && gen.model != env.model_id)
      return fail({404, "the model '" + gen.model + "' does not exist", "invalid_request_error", "model",
                   "model_not_found"});
    prompt = cr.prompt_ids ? *cr.prompt_ids : env.tok.encode(cr.prompt_text, false);
    if (prompt.empty())
      return fail({400, "the prompt encodes to no tokens", "invalid_request_error", "prompt", ""});
    if (cr.echo) call->echo = cr.prompt_ids ? utf8_sanitize(env.tok.decode(prompt)) : cr.prompt_text;
  }
  if (int64_t(prompt.size()) >= env.n_ctx)
    return fail({400,
                 "This model's maximum context length is " + std::to_string(env.n_ctx) +
                     " tokens; the prompt has " + std::to_string(prompt.size()) + " tokens.",
                 "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"});
  std::vector<int32_t> stops = gen.stop_token_ids;
  if (!gen.ignore_eos) {
    for (int32_t id : {env.tok.n_base() + 1, env.tok.n_base() + 2, env.cfg.eos_id})
      if (id >= 0) stops.push_back(id);
    if (chat)
      for (int32_t id : env.tmpl.stop_ids()) stops.push_back(id);
  }
  call->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  call->stream = gen.stream;
  call->include_usage = gen.include_usage;
  call->n_prompt = int64_t(prompt.size());
  const int64_t room = env.n_ctx - int64_t(prompt.size());
  call->choices.resize(size_t(gen.n));
  for (int i = 0; i < gen.n; ++i) {
    Choice& c = call->choices[size_t(i)];
    c.index = i;
    c.stop = std::make_unique<StopMatcher>(gen.stop);
    if (chat)
      c.parser = env.tmpl.make_parser(chat_opts);
    else
      c.dec = std::make_unique<StreamDecoder>(env.tok);
    auto r = std::make_shared<Request>();
    r->prompt = prompt;
    r->max_new = int(gen.max_tokens > 0 ? std::min<int64_t>(gen.max_tokens, room) : room);
    r->n_ctx = env.n_ctx;
    r->sampling = gen.sampling;
    r->sampling.seed = gen.sampling.seed + uint64_t(i);
    r->stop_ids = stops;
    std::shared_ptr<Channel> ch = c.ch;
    r->on_token = [ch](int32_t id, const SampleResult&) {
      ch->push({false, id, FinishReason::aborted, {}});
      return true;
    };
    r->on_done = [ch](FinishReason why, const Status& err) { ch->push({true, -1, why, err}); };
    c.req = r;
  }
  for (size_t i = 0; i < call->choices.size(); ++i)
    if (!env.submit(call->choices[i].req)) {
      for (size_t j = 0; j < i; ++j) call->choices[j].req->cancelled = true;
      return fail({429, "the server is busy: the request queue is full; retry later", "rate_limit_error", "",
                   "queue_full"});
    }
  env.metrics.prompt_tokens += int64_t(prompt.size());
  if (call->stream) return respond_stream(env, call, res);
  respond_whole(env, *call, res);
  env.metrics.cached_tokens += call->choices[0].req->n_cached;
}

}  // namespace k3::server
