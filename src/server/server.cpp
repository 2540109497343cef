// server.cpp: routes, the engine thread, and the response / SSE chunk shapes of FORMATS.md §4.
#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "engine/runner.h"
#include "server/metrics.h"
#include "server/peer.h"
#include "server/protocol.h"
#include "server/session.h"

namespace k3::server {

struct Server::Impl {
  Model& model;
  const Tokenizer& tok;
  const ChatTemplate& tmpl;
  ServerOptions opt;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<ModelBackend> backend;
  std::unique_ptr<Scheduler> sched;
  httplib::Server http;
  std::thread engine;
  std::atomic<bool> stopping{false};  // the engine thread ends
  std::atomic<bool> draining{false};  // stop() was called: refuse new work, finish or cancel the rest
  std::atomic<int64_t> drain_deadline_ns{0};
  std::mutex wake_mu;
  std::condition_variable wake;
  int64_t created = 0;
  Metrics metrics;

  Impl(Model& m, const Tokenizer& t, const ChatTemplate& c, ServerOptions o)
      : model(m), tok(t), tmpl(c), opt(std::move(o)) {
    const ModelConfig& cfg = model.config();
    if (opt.cache) {
      CacheOptions co = opt.cache_options;
      StateLayout L = StateLayout::make(cfg, co.block_tokens);
      if (co.n_pages <= 0) {  // every running sequence at full context, the same again for cached prefixes
        const int64_t blocks = (opt.n_ctx + co.block_tokens - 1) / co.block_tokens + 1;
        co.n_pages =
            int32_t(2 * opt.sched.max_running * blocks * L.pages_per_block() +
                    8 * opt.sched.max_running * int64_t(L.kda_layers.size()) * L.pages_per_kda_group());
      }
      cache = std::make_unique<PrefixCache>(L, co);
    }
    backend = std::make_unique<ModelBackend>(model, cache.get());
    sched = std::make_unique<Scheduler>(*backend, opt.sched);
    created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
  }

  void engine_loop() {
    bool cancelled_all = false;
    while (!stopping) {
      if (draining && !cancelled_all &&
          std::chrono::steady_clock::now().time_since_epoch().count() >= drain_deadline_ns) {
        sched->cancel_all();  // the grace period is over
        cancelled_all = true;
      }
      const bool worked = sched->step();
      metrics.running = sched->n_running();
      metrics.waiting = sched->n_waiting();
      if (cache) {
        metrics.pages_used = cache->pool().n_used() - cache->pool().n_evictable();
        metrics.pages_cached = cache->pool().n_evictable();
        metrics.pages_total = cache->pool().n_pages();
      }
      if (!worked) {
        std::unique_lock<std::mutex> lk(wake_mu);
        wake.wait_for(lk, std::chrono::milliseconds(20));
      }
    }
    sched->cancel_all();  // shutdown: whatever is queued or running ends as aborted
    sched->step();
  }

  bool submit(const std::shared_ptr<Request>& r) {
    if (!sched->submit(r)) return false;
    wake.notify_one();
    return true;
  }

  void routes();
};

namespace {

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.http, error_body(e));
}

std::optional<json> parse_body(const httplib::Request& req, httplib::Response& res) {
  try {
    return json::parse(req.body);
  } catch (const json::parse_error& e) {
    send_error(res, {400, std::string("invalid JSON body: ") + e.what(), "invalid_request_error", "",
                     "invalid_json"});
    return std::nullopt;
  }
}

}  // namespace

void Server::Impl::routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.new_task_queue = [] { return new httplib::ThreadPool(64); };
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, {401, "invalid or missing API key", "authentication_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res,
                 {404, "no route " + req.method + " " + req.path, "invalid_request_error", "", "not_found"});
    else if (res.status == 413)
      send_error(res, {413, "request body too large", "invalid_request_error", "", "payload_too_large"});
    else if (res.status >= 400 && res.status < 500)
      send_error(res, {res.status, "bad request", "invalid_request_error", "", ""});
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, what, "server_error", "", "internal_error"});
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  auto model_obj = [this] {
    return json{{"id", opt.model_id},
                {"object", "model"},
                {"created", created},
                {"owned_by", "k3.cpp"},
                {"max_model_len", opt.n_ctx}};
  };
  http.Get("/v1/models", [this, model_obj](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_obj()})}});
  });
  http.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == opt.model_id) return send_json(res, 200, model_obj());
    send_error(res, {404, "the model '" + std::string(req.matches[1]) + "' does not exist",
                     "invalid_request_error", "model", "model_not_found"});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus(), "text/plain; version=0.0.4");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = parse_body(req, res);
    if (!body) return;
    std::vector<int32_t> ids;
    if (body->is_object() && body->contains("messages")) {  // vLLM: the rendered chat prompt
      ChatRequest cr;
      if (auto e = parse_chat(*body, model.config().n_vocab, &cr)) return send_error(res, *e);
      auto r = tmpl.render(cr.messages, cr.options);
      if (!r.ok())
        return send_error(res, {400, r.status().message(), "invalid_request_error", "messages", ""});
      ids = std::move(r).value();
    } else if (body->is_object() && body->contains("prompt") && (*body)["prompt"].is_string()) {
      ids = tok.encode((*body)["prompt"].get<std::string>(), body->value("add_special_tokens", false));
    } else {
      return send_error(res, {400, "'prompt' must be a string (or give 'messages')", "invalid_request_error",
                              "prompt", ""});
    }
    send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", opt.n_ctx}});
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = parse_body(req, res);
    if (!body) return;
    const int32_t V = tok.n_vocab();
    if (!body->is_object() || !body->contains("tokens") || !(*body)["tokens"].is_array())
      return send_error(res,
                        {400, "'tokens' must be a list of token ids", "invalid_request_error", "tokens", ""});
    std::vector<int32_t> ids;
    for (const json& x : (*body)["tokens"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= V)
        return send_error(res, {400, "'tokens' holds a value that is not a token id", "invalid_request_error",
                                "tokens", ""});
      ids.push_back(x.get<int32_t>());
    }
    send_json(res, 200, {{"prompt", utf8_sanitize(tok.decode(ids))}});
  });
  auto generate = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      auto body = parse_body(req, res);
      if (!body) return;
      metrics.requests++;
      if (draining) {
        metrics.errors++;
        return send_error(res,
                          {503, "the server is shutting down", "server_error", "", "server_shutting_down"});
      }
      int fd = -2;  // not looked up yet
      SessionEnv env{model.config(),
                     tok,
                     tmpl,
                     opt.model_id,
                     opt.n_ctx,
                     created,
                     metrics,
                     [this](const std::shared_ptr<Request>& r) { return submit(r); },
                     opt.timeout_s,
                     [&req, &fd] {
                       if (fd == -2)
                         fd = find_socket(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
                       return peer_closed(fd);
                     }};
      run_session(env, chat, *body, res);
    };
  };
  http.Post("/v1/chat/completions", generate(true));
  http.Post("/v1/completions", generate(false));
}

Server::Server(Model& model, const Tokenizer& tok, const ChatTemplate& tmpl, ServerOptions opt)
    : impl_(std::make_unique<Impl>(model, tok, tmpl, std::move(opt))) {
  impl_->routes();
}

Server::~Server() {
  stop();
  impl_->stopping = true;
  if (impl_->engine.joinable()) impl_->engine.join();
}

int Server::port() const {
  return impl_->opt.port;
}

Status Server::run() {
  Impl& s = *impl_;
  if (s.opt.port == 0) {
    s.opt.port = s.http.bind_to_any_port(s.opt.host.c_str());
    if (s.opt.port <= 0) return error(Code::invalid_argument, "cannot bind " + s.opt.host);
  } else if (!s.http.bind_to_port(s.opt.host.c_str(), s.opt.port)) {
    return error(Code::invalid_argument, "cannot bind " + s.opt.host + ":" + std::to_string(s.opt.port));
  }
  s.engine = std::thread([&s] { s.engine_loop(); });
  std::fprintf(stderr,
               "k3 serve: listening on http://%s:%d (model '%s', ctx %lld, parallel %d, prefix cache %s)\n",
               s.opt.host.c_str(), s.opt.port, s.opt.model_id.c_str(), (long long)s.opt.n_ctx,
               s.opt.sched.max_running, s.cache ? "on" : "off");
  const bool ok = s.http.listen_after_bind();
  s.stopping = true;
  s.wake.notify_one();
  if (s.engine.joinable()) s.engine.join();
  return ok ? ok_status() : error(Code::internal, "the HTTP server stopped with an error");
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.draining.exchange(true)) {
    const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::max(s.opt.shutdown_grace_s, 0.0)));
    s.drain_deadline_ns = (std::chrono::steady_clock::now() + grace).time_since_epoch().count();
  }
  s.wake.notify_one();
  s.http.stop();  // listen_after_bind() returns once the open handlers are done
}

}  // namespace k3::server
