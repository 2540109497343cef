// k3 logits
#include "commands.h"

namespace k3::cli {

void add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("logits", "skeleton"); });
}

}  // namespace k3::cli
