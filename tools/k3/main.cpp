// k3: the command-line front end. Every subcommand is in tools/k3/cmd_<name>.cpp.
#include <cstdio>

#include "commands.h"

namespace k3::cli {

int& exit_code() {
  static int code = 0;
  return code;
}

void not_available(const char* command, const char* what) {
  std::fprintf(stderr, "k3 %s: not available yet (%s).\n", command, what);
  exit_code() = 2;
}

}  // namespace k3::cli

int main(int argc, char** argv) {
  CLI::App app{"k3: inference engine for Kimi Linear, Kimi K3 and Kimi K3.1"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "k3.cpp 0.1.0");
  k3::cli::add_info(app);
  k3::cli::add_tokenize(app);
  k3::cli::add_run(app);
  k3::cli::add_chat(app);
  k3::cli::add_perplexity(app);
  k3::cli::add_logits(app);
  k3::cli::add_serve(app);
  k3::cli::add_bench(app);
  k3::cli::add_plan(app);
  CLI11_PARSE(app, argc, argv);
  return k3::cli::exit_code();
}
