// log.h: one-line diagnostics to stderr, filtered by level (K3_LOG=debug|info|warn|error).
#pragma once

#include <cstdarg>

namespace k3 {

enum class LogLevel { debug, info, warn, error, quiet };

void set_log_level(LogLevel level);
LogLevel log_level();
void log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace k3

#define K3_LOG_DEBUG(...) ::k3::log(::k3::LogLevel::debug, __VA_ARGS__)
#define K3_LOG_INFO(...) ::k3::log(::k3::LogLevel::info, __VA_ARGS__)
#define K3_LOG_WARN(...) ::k3::log(::k3::LogLevel::warn, __VA_ARGS__)
#define K3_LOG_ERROR(...) ::k3::log(::k3::LogLevel::error, __VA_ARGS__)
