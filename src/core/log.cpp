#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace k3 {

namespace {
LogLevel level_from_env() {
  const char* s = std::getenv("K3_LOG");
  if (!s) return LogLevel::info;
  if (!std::strcmp(s, "debug")) return LogLevel::debug;
  if (!std::strcmp(s, "warn")) return LogLevel::warn;
  if (!std::strcmp(s, "error")) return LogLevel::error;
  if (!std::strcmp(s, "quiet")) return LogLevel::quiet;
  return LogLevel::info;
}
std::atomic<LogLevel> g_level{level_from_env()};
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

void log(LogLevel level, const char* fmt, ...) {
  if (level < g_level.load()) return;
  static const char* kTag[] = {"debug", "info", "warn", "error"};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "k3 %s: %s\n", kTag[int(level)], buf);
}

}  // namespace k3
