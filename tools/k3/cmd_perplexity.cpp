// k3 perplexity
#include "commands.h"

namespace k3::cli {

void add_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand("perplexity", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("perplexity", "skeleton"); });
}

}  // namespace k3::cli
