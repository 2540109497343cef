// k3 chat
#include "commands.h"

namespace k3::cli {

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("chat", "skeleton"); });
}

}  // namespace k3::cli
