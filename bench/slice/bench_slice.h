// bench_slice.h: what the two files of bench_slice share (bench_slice.cpp: main, JSON lines, copy
// bandwidth; bench_slice_run.cpp: the checks and the decode timings of one model).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>  // environ

namespace slice {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
inline std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  for (size_t i = 0; i < s.size();) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::stoll(s.substr(i, j - i)));
    i = j + 1;
  }
  return v;
}
inline double nmse(const float* y, const float* r, int64_t n) {
  double a = 0, b = 0;
  for (int64_t i = 0; i < n; ++i) a += (double(y[i]) - r[i]) * (double(y[i]) - r[i]), b += double(r[i]) * r[i];
  return b > 0 ? a / b : a;
}

struct Args {
  std::string m3, m31, jsonl, commit = "unknown";
  double budget_s = 100;
  std::vector<int64_t> batches = {1, 8, 64}, contexts = {4096, 32768, 131072};
  int steps = 5;
  bool check = true, decode = true;
  bool profile_step = false;  // one more eager step of the first (B, T) between cudaProfilerStart / Stop
};

// The engine switches set in the environment (K3_*=...), space-separated, quotes and backslashes dropped:
// they pick kernels and paths, so every JSON line records them.
inline std::string k3_switches() {
  std::string s;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "K3_", 3) != 0) continue;
    if (!s.empty()) s += ' ';
    for (const char* c = *e; *c; ++c)
      if (*c != '"' && *c != '\\') s += *c;
  }
  return s;
}

struct Out {
  const Args& a;
  std::string machine;
  std::string switches = k3_switches();
  // One JSON line (stdout and --jsonl): metric "<model> <what>"; ratio = value / peer_value when given;
  // met = ratio (value itself without a peer) <= goal (lower_better) or >= goal; switches = k3_switches().
  void line(const std::string& model, const std::string& metric, double value, const char* unit,
            const char* peer = nullptr, double peer_value = 0, double goal = 0, bool lower_better = true) {
    char buf[1536];
    const double ratio = peer_value > 0 ? value / peer_value : 0;
    const double r = peer_value > 0 ? ratio : value;
    const bool met = goal > 0 && (lower_better ? r <= goal : r >= goal);
    std::snprintf(
        buf, sizeof buf,
        "{\"bench\":\"slice\",\"commit\":\"%s\",\"machine\":\"%s\",\"metric\":\"%s %s\",\"value\":%.6g,"
        "\"unit\":\"%s\",\"peer\":%s%s%s,\"peer_value\":%.6g,\"ratio\":%.4g,\"goal\":%.4g,\"met\":%s,"
        "\"switches\":\"%s\"}",
        a.commit.c_str(), machine.c_str(), model.c_str(), metric.c_str(), value, unit, peer ? "\"" : "",
        peer ? peer : "null", peer ? "\"" : "", peer_value, ratio, goal, goal > 0 && met ? "true" : "false",
        switches.c_str());
    std::printf("%s\n", buf);
    if (!a.jsonl.empty()) std::ofstream(a.jsonl, std::ios::app) << buf << "\n";
  }
};

// Checks and decode timings of one slice checkpoint; nonzero when a check fails.
int run_model(const Args& a, Out& out, const std::string& name, const std::string& dir, double copy_bw,
              double t0);

}  // namespace slice
