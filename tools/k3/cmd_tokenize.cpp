// k3 tokenize
#include "commands.h"

namespace k3::cli {

void add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "(not available yet)");
  cmd->allow_extras();
  cmd->callback([] { not_available("tokenize", "skeleton"); });
}

}  // namespace k3::cli
