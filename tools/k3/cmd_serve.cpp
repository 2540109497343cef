// k3 serve: the OpenAI-compatible HTTP server (src/server/server.h, FORMATS.md §4).
//
//   k3 serve -m DIR [--host 127.0.0.1] [--port 8080] [--parallel N] [-c/--ctx-size N] [--api-key KEY]
//            [--alias ID] [--max-queue N] [--step-tokens N] [--cache-block N] [--cache-hash N]
//            [--cache-pages N] [--no-cache] [--cache-dense-checkpoints] [--timeout S] [--shutdown-grace S]
//            [--precision fp32|bf16]
//            [-t THREADS]
//
// Serves until SIGINT / SIGTERM; then stops accepting, lets in-flight requests finish for
// --shutdown-grace seconds, cancels the rest (their clients get 503 / an error event) and exits 0.
#include <pthread.h>
#include <csignal>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "engine_args.h"
#include "io/chat.h"
#include "server/server.h"

namespace k3::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  server::ServerOptions opt;
  bool no_cache = false;
};

Status serve(ServeArgs& a) {
  if (a.opt.n_ctx < 2) return error(Code::invalid_argument, "--ctx-size must be at least 2");
  if (a.opt.cache_options.block_tokens % a.opt.cache_options.hash_tokens != 0)
    return error(Code::invalid_argument, "--cache-block must be a multiple of --cache-hash");
  // Signals go to one watcher thread (blocked everywhere else before any thread starts).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  K3_ASSIGN_OR_RETURN(Loaded l, load_model(a.model, /*with_tokenizer=*/true));
  K3_ASSIGN_OR_RETURN(auto tmpl, make_chat_template(l.model->config().chat_format(), *l.tok));
  if (a.opt.model_id.empty()) a.opt.model_id = std::filesystem::path(a.model.dir).filename().string();
  if (a.opt.model_id.empty())
    a.opt.model_id = std::filesystem::path(a.model.dir).parent_path().filename().string();
  a.opt.cache = !a.no_cache;
  server::Server srv(*l.model, *l.tok, *tmpl, a.opt);
  std::thread watcher([&srv, set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "k3 serve: signal %d, shutting down\n", sig);
    srv.stop();
  });
  Status s = srv.run();
  pthread_kill(watcher.native_handle(), SIGTERM);  // wake the watcher if the server stopped by itself
  watcher.join();
  return s;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->opt.model_id = "";
  a->opt.cache_options.block_tokens = 256;
  a->opt.cache_options.hash_tokens = 64;
  a->opt.cache_options.n_pages = 0;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  add_model_options(cmd, &a->model);
  cmd->add_option("--host", a->opt.host, "address to bind (default 127.0.0.1)");
  cmd->add_option("--port", a->opt.port, "port (default 8080; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", a->opt.sched.max_running, "requests computed at once (default 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-c,--ctx-size", a->opt.n_ctx, "tokens per sequence, prompt + output (default 4096)");
  cmd->add_option("--api-key", a->opt.api_key, "require 'Authorization: Bearer KEY'");
  cmd->add_option("--alias", a->opt.model_id, "model id reported and accepted (default: the directory name)");
  cmd->add_option("--max-queue", a->opt.sched.max_queue, "waiting requests before 429 (default 64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--step-tokens", a->opt.sched.step_tokens,
                  "tokens computed per scheduler step (default 256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cache-block", a->opt.cache_options.block_tokens,
                  "prefix cache physical block, tokens (256)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cache-hash", a->opt.cache_options.hash_tokens, "prefix cache hash block, tokens (64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cache-pages", a->opt.cache_options.n_pages,
                  "pages in the pool (default: from -c and --parallel)");
  cmd->add_flag("--no-cache", a->no_cache, "turn the prefix cache off");
  cmd->add_flag("--cache-dense-checkpoints", a->opt.cache_options.dense_checkpoints,
                "keep a KDA checkpoint at every hash boundary (a divergence resumes within one hash block)");
  cmd->add_option("--timeout", a->opt.timeout_s,
                  "seconds a request may run; then it ends with finish_reason length (default 600, 0 = none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shutdown-grace", a->opt.shutdown_grace_s,
                  "seconds in-flight requests may finish after SIGTERM (default 10)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([a] {
    Status s = serve(*a);
    if (!s.ok()) fail("serve", s);
  });
}

}  // namespace k3::cli
