// k3 info
#include "commands.h"

namespace k3::cli {

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("info", "skeleton"); });
}

}  // namespace k3::cli
