// k3 bench
#include "commands.h"

namespace k3::cli {

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("bench", "skeleton"); });
}

}  // namespace k3::cli
