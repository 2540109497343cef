// bandwidth.h: the machine's sustained memory read bandwidth, the ceiling a decode step is measured
// against (docs/perf.md: every result gets a ratio against a peer or a physical ceiling).
//
//   buffer  B bytes, B >> L3 (default max(4 * L3, 256 MiB), at most 1/4 of available memory), filled
//           with non-zero data first (so every page is really mapped, not the shared zero page)
//   pass    every thread streams its contiguous slice of B once, summing 64-bit words
//           (AVX-512 loads where the CPU has them), the sums kept so the loads cannot be elided
//   result  bytes_per_s = B / (best pass time), over passes until min_seconds have elapsed (>= 3 passes)
//
// Run with the same thread count as the workload it is compared with. Reading is what decode does
// (weights, KDA state, cache); write bandwidth is not measured.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace k3 {

class ThreadPool;

struct BandwidthOptions {
  int64_t buffer_bytes = 0;   // 0 = max(4 * L3, 256 MiB), capped at 1/4 of available memory
  double min_seconds = 0.25;  // keep making passes until this much time has gone by
  int min_passes = 3;
};

struct BandwidthResult {
  double bytes_per_s = 0;  // best pass
  double median_bytes_per_s = 0;
  int64_t buffer_bytes = 0;
  int n_threads = 1;
  int n_passes = 0;
};

// L3 size in bytes from sysfs (0 when unknown).
int64_t l3_cache_bytes();
// `pool` may be null (one thread).
Result<BandwidthResult> measure_read_bandwidth(ThreadPool* pool, const BandwidthOptions& opt = {});

}  // namespace k3
