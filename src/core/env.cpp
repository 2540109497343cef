// env.cpp: see env.h.
#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/log.h"

namespace k3 {

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_switch(const char* name, bool fallback) {
  std::string v = env_value(name);
  if (v.empty()) return fallback;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (v == "1" || v == "on" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(name).second)
    K3_LOG_WARN("%s=%s is neither on (1, on, true, yes) nor off (0, off, false, no); using the default (%s)", name,
                v.c_str(), fallback ? "on" : "off");
  return fallback;
}

}  // namespace k3
