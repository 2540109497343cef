// commands.h: each `k3 <command>` lives in its own cmd_<name>.cpp and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace k3::cli {

// Each returns after adding its subcommand (with its callback) to `app`.
void add_info(CLI::App& app);
void add_tokenize(CLI::App& app);      // tokenize + detokenize
void add_run(CLI::App& app);
void add_chat(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_logits(CLI::App& app);
void add_serve(CLI::App& app);
void add_bench(CLI::App& app);
void add_plan(CLI::App& app);

// Exit code a command's callback sets; main returns it.
int& exit_code();

// A command that a later issue fills in: says so plainly and exits non-zero.
void not_available(const char* command, const char* what);

}  // namespace k3::cli
