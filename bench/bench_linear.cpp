// bench_linear.cpp: decode GEMV (n_tok = 1) of linear_cpu against the machine's measured read bandwidth.
//
//   GEMV bf16 and MXFP4 (x fp32 exact, and x bf16-rounded) with a weight larger than the L3 cache
//   (>= 1.25 x L3, at least ~100 MB), so every call streams the weights from DRAM. Metric: weight bytes
//   (+ MXFP4 scale bytes) per second.
//   Peer: a streaming sum over a buffer of the same size with the same thread count (default 2).
//
// Usage: bench_linear [--k3_threads=N] [--k3_jsonl=FILE --k3_commit=HASH --k3_machine=NAME] [benchmark flags]
// With --k3_jsonl it appends one JSON line per GEMV: {bench, commit, machine, metric, value, unit, peer,
// peer_value, ratio, goal, met}; the goal is ratio >= 0.8 of the read bandwidth.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

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

// Keeps bytes_per_second of every run, by name.
class Collect : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> gbps;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      auto it = r.counters.find("bytes_per_second");
      const std::string name = r.benchmark_name();  // "gemv_bf16_xf32/real_time"
      if (it != r.counters.end() && r.run_type == Run::RT_Iteration)
        gbps[name.substr(0, name.find('/'))] = it->second / 1e9;
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
  benchmark::Initialize(&argc, argv);
  Collect rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const double peer = rep.gbps.count("read_bandwidth") ? rep.gbps["read_bandwidth"] : 0;
  std::FILE* f = jsonl.empty() ? nullptr : std::fopen(jsonl.c_str(), "a");
  for (const auto& [name, v] : rep.gbps) {
    if (name == "read_bandwidth" || peer <= 0) continue;
    const double ratio = v / peer;
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"linear/%s\",\"commit\":\"%s\",\"machine\":\"%s\",\"metric\":\"weight_bandwidth\","
                  "\"value\":%.3f,\"unit\":\"GB/s\",\"peer\":\"read_bandwidth_%dthreads\",\"peer_value\":%.3f,"
                  "\"ratio\":%.3f,\"goal\":\"ratio>=0.8\",\"met\":%s}\n",
                  name.c_str(), commit.c_str(), machine.c_str(), v, g_threads, peer, ratio,
                  ratio >= 0.8 ? "true" : "false");
    std::fputs(line, stdout);
    if (f) std::fputs(line, f);
  }
  if (f) std::fclose(f);
  return 0;
}
