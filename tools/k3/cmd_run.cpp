// k3 run
#include "commands.h"

namespace k3::cli {

void add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("run", "skeleton"); });
}

}  // namespace k3::cli
