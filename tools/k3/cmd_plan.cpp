// k3 plan
#include "commands.h"

namespace k3::cli {

void add_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("plan", "skeleton"); });
}

}  // namespace k3::cli
