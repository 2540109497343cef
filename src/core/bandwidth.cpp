// bandwidth.cpp: streaming-read bandwidth (contract in bandwidth.h).
#include "core/bandwidth.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"

namespace k3 {

namespace {

constexpr int64_t kLine = 64;  // bytes; the buffer is a whole number of lines

// Sum of the 64-bit words in [p, p + n_lines * 64); 8 independent accumulators.
uint64_t sum_lines_portable(const uint64_t* p, int64_t n_lines) {
  uint64_t a[8] = {};
  for (int64_t i = 0; i < n_lines; ++i, p += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[j];
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

__attribute__((target("avx512f"))) uint64_t sum_lines_avx512(const uint64_t* p, int64_t n_lines) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 <= n_lines; i += 4, p += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 24));
  }
  for (; i < n_lines; ++i, p += 8) a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
  a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  alignas(64) uint64_t lanes[8];  // unsigned sum (the reduce intrinsic adds signed: overflow is UB)
  _mm512_store_si512(lanes, a0);
  uint64_t s = 0;
  for (uint64_t v : lanes) s += v;
  return s;
}

int64_t available_memory_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * page : 0;
}

}  // namespace

int64_t l3_cache_bytes() {
  // index3 is L3 on x86 Linux; the size reads like "266240K".
  for (int idx = 0; idx < 8; ++idx) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    std::string s;
    if (!(level >> lv) || !(size >> s) || lv != 3 || s.empty()) continue;
    int64_t v = std::atoll(s.c_str());
    const char unit = s.back();
    if (unit == 'K')
      v <<= 10;
    else if (unit == 'M')
      v <<= 20;
    else if (unit == 'G')
      v <<= 30;
    return v;
  }
  return 0;
}

Result<BandwidthResult> measure_read_bandwidth(ThreadPool* pool, const BandwidthOptions& opt) {
  int64_t bytes = opt.buffer_bytes;
  if (bytes <= 0) {
    bytes = std::max<int64_t>(4 * l3_cache_bytes(), int64_t(256) << 20);
    const int64_t avail = available_memory_bytes();
    if (avail > 0) bytes = std::min(bytes, avail / 4);
  }
  bytes = std::max<int64_t>(bytes / kLine, 1) * kLine;
  const int64_t n_lines = bytes / kLine;

  std::unique_ptr<uint64_t, decltype(&std::free)> buf(
      static_cast<uint64_t*>(std::aligned_alloc(size_t(kLine), size_t(bytes))), &std::free);
  if (!buf)
    return error(Code::out_of_memory,
                 "bandwidth: cannot allocate a " + std::to_string(bytes >> 20) + " MiB read buffer");
  uint64_t* data = buf.get();
  // First touch from the threads that will read (page placement), non-zero so pages are real.
  parallel_for(pool, n_lines, [&](int64_t b, int64_t e) {
    for (int64_t i = b * 8; i < e * 8; ++i) data[i] = uint64_t(i) * 0x9E3779B97F4A7C15ull + 1;
  });

  const bool avx512 = cpu_level() >= CpuLevel::avx512;
  std::atomic<uint64_t> sink{0};
  std::vector<double> rates;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(pool, n_lines, [&](int64_t b, int64_t e) {
      const uint64_t* p = data + b * 8;
      const uint64_t s = avx512 ? sum_lines_avx512(p, e - b) : sum_lines_portable(p, e - b);
      sink.fetch_xor(s, std::memory_order_relaxed);
    });
    const auto t1 = std::chrono::steady_clock::now();
    rates.push_back(double(bytes) / std::max(std::chrono::duration<double>(t1 - t0).count(), 1e-9));
    const double elapsed = std::chrono::duration<double>(t1 - start).count();
    if (int(rates.size()) >= opt.min_passes && elapsed >= opt.min_seconds) break;
    if (rates.size() >= 1000) break;
  }
  if (sink.load() == 0x5A5A5A5A5A5A5A5Aull) rates.push_back(0);  // keeps the sums observable

  BandwidthResult r;
  r.buffer_bytes = bytes;
  r.n_threads = pool ? pool->size() : 1;
  r.n_passes = int(rates.size());
  std::sort(rates.begin(), rates.end());
  r.bytes_per_s = rates.back();
  r.median_bytes_per_s = rates[rates.size() / 2];
  return r;
}

}  // namespace k3
