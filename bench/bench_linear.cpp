// bench_linear.cpp: decode GEMV (n_tok = 1) of linear_cpu against the machine's measured read bandwidth,
// and the prefill GEMM (n_tok = 64) against the machine's measured vdpbf16ps issue rate.
//
//   GEMV bf16 and MXFP4 (x fp32 exact, and x bf16-rounded) with a weight larger than the L3 cache
//   (>= 1.25 x L3, at least ~100 MB), so every call streams the weights from DRAM. Metric: weight bytes
//   (+ MXFP4 scale bytes) per second.
//   Peer: a streaming sum over a buffer of the same size with the same thread count (default 2).
//   GEMM bf16 weights x bf16-rounded x, n_tok = 64, out 4096, in 2304 (a KL-48B-width projection; the weight
//   stays in L3): FLOP/s (2 n_tok out in per call). Peer: independent vdpbf16ps chains in registers on the
//   same threads (64 FLOP per instruction), the ceiling of the bf16 dot path on this CPU, same run.
//
// Usage: bench_linear [--k3_threads=N] [--k3_jsonl=FILE --k3_commit=HASH --k3_machine=NAME] [benchmark flags]
// On a shared machine: --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true (medians are
// used, the runs of the GEMM and of its ceiling interleave).
// With --k3_jsonl it appends one JSON line per GEMV: {bench, commit, machine, metric, value, unit, peer,
// peer_value, ratio, goal, met}; the goal is ratio >= 0.8 of the read bandwidth.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/linear.h"

namespace {

int g_threads = 2;
constexpr int64_t kIn = 7168;

int64_t big_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const int64_t want = std::max<int64_t>(int64_t(kIn) * kIn * 2, l3 > 0 ? int64_t(l3) * 5 / 4 : 0);
  return want;
}

k3::ThreadPool& pool() {
  static k3::ThreadPool p(g_threads);
  return p;
}

void BM_read_bandwidth(benchmark::State& state) {
  const int64_t n = big_bytes() / 8;
  std::vector<uint64_t> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = uint64_t(i) * 2654435761u;
  std::vector<uint64_t> partial(64);
  for (auto _ : state) {
    k3::parallel_for(&pool(), n / 4096, [&](int64_t b, int64_t e) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b * 4096; i < e * 4096; i += 4) {
        s0 += buf[size_t(i)];
        s1 += buf[size_t(i + 1)];
        s2 += buf[size_t(i + 2)];
        s3 += buf[size_t(i + 3)];
      }
      partial[size_t(b % 64)] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * 8);
}

void BM_gemv(benchmark::State& state, bool mxfp4, k3::Precision prec) {
  const int64_t bytes_per_row = mxfp4 ? kIn / 2 + kIn / 32 : kIn * 2;
  const int64_t out = big_bytes() / bytes_per_row;
  std::vector<uint8_t> w(size_t(out * (mxfp4 ? kIn / 2 : kIn * 2))), scale;
  std::mt19937 gen(1);
  for (auto& b : w) b = uint8_t(gen());
  if (!mxfp4) {  // bf16 weights like a checkpoint's: N(0, 0.02), no subnormals (they cost FMA assists)
    auto* h = reinterpret_cast<uint16_t*>(w.data());
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (size_t i = 0; i < w.size() / 2; ++i) h[i] = k3::f32_to_bf16(nd(gen));
  }
  if (mxfp4) scale.assign(size_t(out * kIn / 32), 120);
  k3::LinearWeight W{mxfp4 ? k3::DType::u8 : k3::DType::bf16, out, kIn, w.data(), mxfp4 ? scale.data() : nullptr};
  std::vector<float> x(static_cast<size_t>(kIn)), y(static_cast<size_t>(out));
  for (auto& v : x) v = k3::round_bf16(std::uniform_real_distribution<float>(-1, 1)(gen));
  k3::LinearParams p;
  p.n_tok = 1;
  p.x = x.data();
  p.y = y.data();
  p.x_precision = prec;
  for (auto _ : state) {
    k3::linear_cpu(W, p, &pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.size() + scale.size()));
  state.counters["weight_MB"] = double(w.size() + scale.size()) / 1e6;
}

// 12 independent vdpbf16ps chains per thread, registers only: the issue-rate ceiling of the bf16 dot path.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_chains(int64_t n) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i));
  __m512i x = _mm512_set1_epi16(0x3f80), y = _mm512_set1_epi16(0x0001);  // 1.0 x tiny: no overflow
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)x, (__m512bh)y);
    asm volatile("" : "+v"(x));
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  return lanes[0] + lanes[15];
}

constexpr int64_t kChainIters = 1 << 20;

void BM_dpbf16_peak(benchmark::State& state) {
  if (k3::cpu_level() < k3::CpuLevel::avx512_bf16) return state.SkipWithError("no AVX512_BF16");
  std::vector<float> sink(64);
  for (auto _ : state) {
    k3::parallel_for(&pool(), g_threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sink[size_t(i % 64)] = dpbf16_chains(kChainIters);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["flop_per_second"] =
      benchmark::Counter(double(g_threads) * kChainIters * 12 * 64, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_gemm(benchmark::State& state) {
  constexpr int64_t kTok = 64, kOut = 4096, kGin = 2304;
  std::vector<uint16_t> w(size_t(kOut * kGin));
  std::mt19937 gen(2);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (auto& h : w) h = k3::f32_to_bf16(nd(gen));
  k3::LinearWeight W{k3::DType::bf16, kOut, kGin, w.data(), nullptr};
  std::vector<float> x(size_t(kTok * kGin)), y(size_t(kTok * kOut));
  for (auto& v : x) v = k3::round_bf16(std::uniform_real_distribution<float>(-1, 1)(gen));
  k3::LinearParams p;
  p.n_tok = kTok;
  p.x = x.data();
  p.y = y.data();
  p.x_precision = k3::Precision::bf16;
  for (auto _ : state) {
    k3::linear_cpu(W, p, &pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["flop_per_second"] =
      benchmark::Counter(2.0 * kTok * kOut * kGin, benchmark::Counter::kIsIterationInvariantRate);
}

// Keeps bytes_per_second (GEMV) and flop_per_second (GEMM, peak) of every run, by name.
class Collect : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> gbps, gflops;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.benchmark_name();  // "gemv_bf16_xf32/real_time"
      // With --benchmark_repetitions the median aggregate (reported after the runs) overrides the runs.
      if (r.error_occurred || (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median")) continue;
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) gbps[name.substr(0, name.find('/'))] = it->second / 1e9;
      it = r.counters.find("flop_per_second");
      if (it != r.counters.end()) gflops[name.substr(0, name.find('/'))] = it->second / 1e9;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string take_flag(int* argc, char** argv, const char* name, const std::string& dflt) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < *argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      std::string v = argv[i] + prefix.size();
      for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
      --*argc;
      return v;
    }
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  g_threads = std::stoi(take_flag(&argc, argv, "k3_threads", "2"));
  const std::string jsonl = take_flag(&argc, argv, "k3_jsonl", "");
  const std::string commit = take_flag(&argc, argv, "k3_commit", "unknown");
  const std::string machine = take_flag(&argc, argv, "k3_machine", "unknown");
  benchmark::RegisterBenchmark("read_bandwidth", BM_read_bandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemv_bf16_xf32", BM_gemv, false, k3::Precision::fp32)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemv_bf16_xbf16", BM_gemv, false, k3::Precision::bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemv_mxfp4_xf32", BM_gemv, true, k3::Precision::fp32)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemv_mxfp4_xbf16", BM_gemv, true, k3::Precision::bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("dpbf16_peak", BM_dpbf16_peak)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("gemm_bf16_xbf16_t64", BM_gemm)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  Collect rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  std::FILE* f = jsonl.empty() ? nullptr : std::fopen(jsonl.c_str(), "a");
  // One JSON line per result against the ceiling measured in the same run (skipped when it is missing).
  auto emit = [&](const std::map<std::string, double>& results, const char* ceiling_name, const char* metric,
                  const char* unit, int digits, const char* peer_label, double goal) {
    const auto c = results.find(ceiling_name);
    const double ceiling = c != results.end() ? c->second : 0;
    for (const auto& [name, v] : results) {
      if (name == ceiling_name || ceiling <= 0) continue;
      const double ratio = v / ceiling;
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"linear/%s\",\"commit\":\"%s\",\"machine\":\"%s\",\"metric\":\"%s\","
                    "\"value\":%.*f,\"unit\":\"%s\",\"peer\":\"%s_%dthreads\",\"peer_value\":%.*f,"
                    "\"ratio\":%.3f,\"goal\":\"ratio>=%.1f\",\"met\":%s}\n",
                    name.c_str(), commit.c_str(), machine.c_str(), metric, digits, v, unit, peer_label, g_threads,
                    digits, ceiling, ratio, goal, ratio >= goal ? "true" : "false");
      std::fputs(line, stdout);
      if (f) std::fputs(line, f);
    }
  };
  emit(rep.gbps, "read_bandwidth", "weight_bandwidth", "GB/s", 3, "read_bandwidth", 0.8);
  emit(rep.gflops, "dpbf16_peak", "gemm_rate", "GFLOP/s", 2, "vdpbf16ps_issue_rate", 0.7);
  if (f) std::fclose(f);
  return 0;
}
