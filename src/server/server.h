// server.h: the OpenAI-compatible HTTP server (cpp-httplib) in front of the scheduler (FORMATS.md §4).
//
//   GET  /health, /v1/models, /v1/models/{id}, /metrics (Prometheus text)
//   POST /v1/chat/completions, /v1/completions (stream = SSE chunks, include_usage, [DONE]), /tokenize,
//        /detokenize
// Threads: httplib's workers parse requests, render prompts and submit Requests; one engine thread owns
// the Scheduler, the PrefixCache and the Model and runs step() while there is work. Tokens come back to
// the worker through a per-choice channel. A client that goes away (streaming: a failed write;
// non-streaming: its socket polled while waiting, peer.h) cancels its requests: their pages are released
// at the next step. Client mistakes are 4xx with the OpenAI error object, never 5xx.
// Limits: body size (413), prompt length (400 context_length_exceeded), prompts x n (400), queue (429),
// per-request timeout (generation ends with finish_reason "length").
// Shutdown (stop(), on SIGTERM / SIGINT): the listener closes, new requests on open connections get 503,
// in-flight requests may finish for `shutdown_grace_s`, then what is left is cancelled (503 / an error
// event) and run() returns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cache/prefix_index.h"
#include "core/status.h"
#include "engine/scheduler.h"
#include "io/chat.h"
#include "io/tokenizer.h"
#include "model/model.h"

namespace k3::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // "" = no auth
  std::string model_id = "k3";
  int64_t n_ctx = 4096;
  bool cache = true;           // prefix cache on
  CacheOptions cache_options;  // n_pages = 0: sized from n_ctx and the scheduler's max_running
  SchedulerOptions sched;
  size_t max_body_bytes = 16u << 20;
  double timeout_s = 600;        // per request (submission to last token), 0 = none
  double shutdown_grace_s = 10;  // in-flight requests may finish this long after stop()
};

class Server {
 public:
  Server(Model& model, const Tokenizer& tok, const ChatTemplate& tmpl, ServerOptions opt);
  ~Server();
  // Binds and serves until stop(); the bound port is port() (useful with port 0).
  Status run();
  // Graceful: see above. Safe from any thread (the signal watcher); idempotent.
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::server
