// k3 serve
#include "commands.h"

namespace k3::cli {

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("serve", "skeleton"); });
}

}  // namespace k3::cli
