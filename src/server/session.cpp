// session.cpp: one completion call: parsing, prompts, submission, token intake (session.h, call.h).
#include "server/session.h"

#include <httplib.h>

#include <random>

#include "server/call.h"

namespace k3::server {

void Channel::push(Event e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

bool Channel::pop(Event* e, int wait_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !q_.empty(); })) return false;
  *e = std::move(q_.front());
  q_.pop_front();
  return true;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

namespace {

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

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 gen(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[gen() % 16];
  return s;
}

}  // namespace

void poll(const SessionEnv& env, const Call& call, Choice& c, std::vector<ChatEvent>& out, int wait_ms) {
  Event e;
  while (!c.done && c.ch->pop(&e, wait_ms)) {
    wait_ms = 0;
    if (!e.done) {
      if (c.stop_hit) continue;
      if (c.toks.empty())
        env.metrics.observe_ttft(std::chrono::duration<double>(Clock::now() - c.t0).count());
      env.metrics.generated_tokens++;
      c.toks.push_back({e.id, e.logprob, std::move(e.top), c.chars});
      if (!call.chat) c.chars += code_points(utf8_sanitize(env.tok.token_bytes(e.id)));
      if (call.chat) {
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
    if (call.chat) {
      std::vector<ChatEvent> ev;
      c.parser->finish(ev);
      on_chat_events(c, ev, out);
    } else if (!c.stop->stopped()) {
      emit(c, ChatEvent::Kind::content, c.stop->push(c.dec->flush()), out);
    }
    if (!c.stop->stopped()) emit(c, ChatEvent::Kind::content, c.stop->flush(), out);
  }
}

void check_deadline(const SessionEnv& env, Call& call) {
  if (Clock::now() < call.deadline) return;
  for (Choice& c : call.choices)
    if (!c.done && !c.timed_out && !c.stop_hit) {
      c.timed_out = true;
      c.req->cancelled = true;
      env.metrics.timeouts++;
    }
}

bool failed(const Choice& c) {
  return c.done && !c.stop_hit && !c.timed_out && c.why == FinishReason::aborted;
}

void run_session(const SessionEnv& env, bool chat, const json& body, httplib::Response& res) {
  auto fail = [&](const ApiError& e) {
    env.metrics.errors++;
    res.status = e.http;
    res.set_content(dump(error_body(e)), "application/json");
  };
  auto call = std::make_shared<Call>();
  call->chat = chat;
  ChatOptions chat_opts;
  if (chat) {
    ChatRequest cr;
    if (auto e = parse_chat(body, env.cfg.n_vocab, &cr)) return fail(*e);
    call->gen = cr.gen;
    chat_opts = cr.options;
    if (!call->gen.model.empty() && call->gen.model != env.model_id)
      return fail({404, "the model '" + call->gen.model + "' does not exist", "invalid_request_error",
                   "model", "model_not_found"});
    auto ids = env.tmpl.render(cr.messages, cr.options);
    if (!ids.ok()) return fail({400, ids.status().message(), "invalid_request_error", "messages", ""});
    call->prompts.push_back({std::move(ids).value(), ""});
  } else {
    CompletionRequest cr;
    if (auto e = parse_completion(body, env.cfg.n_vocab, &cr)) return fail(*e);
    call->gen = cr.gen;
    if (!call->gen.model.empty() && call->gen.model != env.model_id)
      return fail({404, "the model '" + call->gen.model + "' does not exist", "invalid_request_error",
                   "model", "model_not_found"});
    for (const CompletionPrompt& p : cr.prompts) {
      PromptInfo info;
      info.ids = p.ids ? *p.ids : env.tok.encode(p.text, false);
      if (info.ids.empty())
        return fail({400, "a prompt encodes to no tokens", "invalid_request_error", "prompt", ""});
      if (cr.echo) info.echo = p.ids ? utf8_sanitize(env.tok.decode(info.ids)) : p.text;
      call->prompts.push_back(std::move(info));
    }
  }
  const GenParams& gen = call->gen;
  for (const PromptInfo& p : call->prompts)
    if (int64_t(p.ids.size()) >= env.n_ctx)
      return fail({400,
                   "This model's maximum context length is " + std::to_string(env.n_ctx) +
                       " tokens; the prompt has " + std::to_string(p.ids.size()) + " tokens.",
                   "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"});
  std::vector<int32_t> stops = gen.stop_token_ids;
  if (!gen.ignore_eos) {
    for (int32_t id : {env.tok.n_base() + 1, env.tok.n_base() + 2, env.cfg.eos_id})
      if (id >= 0) stops.push_back(id);
    if (chat)
      for (int32_t id : env.tmpl.stop_ids()) stops.push_back(id);
  }
  call->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  if (env.timeout_s > 0)
    call->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(env.timeout_s));
  call->choices.resize(call->prompts.size() * size_t(gen.n));
  for (size_t i = 0; i < call->choices.size(); ++i) {
    Choice& c = call->choices[i];
    c.index = int(i);
    c.prompt = int(i) / gen.n;
    const PromptInfo& p = call->prompts[size_t(c.prompt)];
    c.chars = code_points(p.echo);
    c.stop = std::make_unique<StopMatcher>(gen.stop);
    if (chat)
      c.parser = env.tmpl.make_parser(chat_opts);
    else
      c.dec = std::make_unique<StreamDecoder>(env.tok);
    auto r = std::make_shared<Request>();
    r->prompt = p.ids;
    const int64_t room = env.n_ctx - int64_t(p.ids.size());
    r->max_new = int(gen.max_tokens > 0 ? std::min<int64_t>(gen.max_tokens, room) : room);
    r->n_ctx = env.n_ctx;
    r->sampling = gen.sampling;
    r->sampling.seed = gen.sampling.seed + uint64_t(i);
    r->stop_ids = stops;
    std::shared_ptr<Channel> ch = c.ch;
    r->on_token = [ch](int32_t id, const SampleResult& s) {
      ch->push({false, id, s.logprob, s.top, FinishReason::aborted, {}});
      return true;
    };
    r->on_done = [ch](FinishReason why, const Status& err) { ch->push({true, -1, 0, {}, why, err}); };
    c.req = r;
  }
  for (size_t i = 0; i < call->choices.size(); ++i)
    if (!env.submit(call->choices[i].req)) {
      for (size_t j = 0; j < i; ++j) call->choices[j].req->cancelled = true;
      return fail({429, "the server is busy: the request queue is full; retry later", "rate_limit_error", "",
                   "queue_full"});
    }
  for (const PromptInfo& p : call->prompts) env.metrics.prompt_tokens += int64_t(p.ids.size());
  if (gen.stream) return respond_stream(env, call, res);
  respond_whole(env, *call, res);
}

}  // namespace k3::server
