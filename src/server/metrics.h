// metrics.h: the server's counters and gauges, rendered as Prometheus text for GET /metrics.
//
// Counters only grow; gauges are refreshed by the engine thread after every scheduler step. Every field
// is atomic: request threads and the engine thread update them without a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace k3::server {

struct Metrics {
  // counters
  std::atomic<int64_t> requests{0}, errors{0}, prompt_tokens{0}, generated_tokens{0}, cached_tokens{0};
  std::atomic<int64_t> disconnects{0};  // requests cancelled because their client went away
  std::atomic<int64_t> timeouts{0};     // requests ended by the per-request timeout
  // gauges
  std::atomic<int64_t> running{0}, waiting{0}, pages_used{0}, pages_cached{0}, pages_total{0};
  // time to first token histogram: <= 0.1, 0.5, 1, 5, 30 s, +Inf
  std::atomic<int64_t> ttft_le[6] = {};
  std::atomic<int64_t> ttft_count{0};
  std::atomic<double> ttft_sum{0};

  void observe_ttft(double seconds);
  std::string prometheus() const;
};

}  // namespace k3::server
