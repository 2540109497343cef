// harness.cpp: test-ops main: `test` compares every backend with the reference, `perf` times them,
// `list` prints the cases. See harness.h for the case API and the checks.
#include "harness.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/cpu_features.h"
#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "gpu/context.h"

namespace k3::opt {

namespace {
constexpr size_t kGuard = 64;
constexpr uint8_t kCanary = 0xa5;
constexpr uint32_t kF32Fill = 0x7fa0beefu;  // a NaN: an element nobody writes shows up as NaN
constexpr uint32_t kI32Fill = 0x5a5a5a5au;
}  // namespace

void GuardedBuffer::alloc(size_t n, uint32_t fill_pattern, size_t elem_size) {
  n_bytes = n * elem_size;
  bytes.assign(n_bytes + kGuard, kCanary);
  for (size_t i = 0; i + 4 <= n_bytes; i += 4) std::memcpy(bytes.data() + i, &fill_pattern, 4);
}

bool GuardedBuffer::guard_intact() const {
  for (size_t i = n_bytes; i < bytes.size(); ++i)
    if (bytes[i] != kCanary) return false;
  return true;
}

RunContext::Slot& RunContext::slot_at(int slot, int64_t n, bool is_f32) {
  if (int(slots.size()) <= slot) slots.resize(size_t(slot) + 1);
  Slot& s = slots[size_t(slot)];
  if (s.n != n || s.is_f32 != is_f32 || s.buf.bytes.empty()) {
    s.n = n;
    s.is_f32 = is_f32;
    s.buf.alloc(size_t(n), is_f32 ? kF32Fill : kI32Fill, 4);
  }
  return s;
}

float* RunContext::out_f32(int slot, int64_t n) {
  return static_cast<float*>(slot_at(slot, n, true).buf.data());
}
int32_t* RunContext::out_i32(int slot, int64_t n) {
  return static_cast<int32_t*>(slot_at(slot, n, false).buf.data());
}

void fill_uniform(Rng& rng, float* x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng.uniform(lo, hi);
}
void fill_normal(Rng& rng, float* x, int64_t n, float std) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng.normal(0, std);
}
void fill_uniform_bf16(Rng& rng, float* x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(rng.uniform(lo, hi));
}

std::vector<std::pair<std::string, CaseFactory>>& case_factories() {
  static std::vector<std::pair<std::string, CaseFactory>> f;
  return f;
}

CaseRegistrar::CaseRegistrar(const char* name, CaseFactory fn) {
  case_factories().emplace_back(name, fn);
}

namespace {

struct BackendSpec {
  std::string name;
  Backend kind;
  CpuLevel level;
};

std::vector<BackendSpec> backends() {
  std::vector<BackendSpec> out;
  const CpuLevel best = cpu_level();
  out.push_back({"ref", Backend::ref, best});
  out.push_back({"cpu", Backend::cpu, best});
  if (best > CpuLevel::avx512) out.push_back({"cpu-avx512", Backend::cpu, CpuLevel::avx512});
  if (best > CpuLevel::portable) out.push_back({"cpu-portable", Backend::cpu, CpuLevel::portable});
#ifdef K3_HAVE_CUDA
  out.push_back({"cuda", Backend::cuda, best});
#endif
  return out;
}

uint64_t seed_of(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

// The device the cuda backend runs on, opened once per invocation when the cuda backend is wanted.
struct GpuSession {
  gpu::ContextOwner owner;
  GpuContext* g = nullptr;  // null: the cuda backend is skipped, `why` says why
  std::string why;
};

void open_gpu(const std::string& backend, GpuSession* s) {
  if (!backend.empty() && backend != "cuda") return;
  if (!kCudaBuilt) {
    s->why = "no CUDA device (built without CUDA: -DK3_CUDA=ON)";
  } else if (k3::cuda::device_count() == 0) {
    s->why = "no CUDA device";
  } else {
    const Status st = s->owner.create();
    if (st.ok())
      s->g = &s->owner.get();
    else
      s->why = "no CUDA device usable: " + st.message();
  }
  if (!s->g) std::printf("cuda backend skipped: %s\n", s->why.c_str());
}

// Compares one backend's outputs with the reference's; returns "" when they agree.
std::string compare(const RunContext& ref, const RunContext& got, double max_nmse, double* nmse_out) {
  *nmse_out = 0;
  if (ref.slots.size() != got.slots.size()) return "different number of outputs";
  char msg[256];
  for (size_t s = 0; s < ref.slots.size(); ++s) {
    const auto &a = ref.slots[s], &b = got.slots[s];
    if (a.n != b.n || a.is_f32 != b.is_f32) return "output " + std::to_string(s) + ": size or type differs";
    if (!a.buf.guard_intact()) return "output " + std::to_string(s) + ": reference wrote past its end";
    if (!b.buf.guard_intact()) return "output " + std::to_string(s) + ": guard bytes overwritten";
    if (!a.is_f32) {
      const auto* x = static_cast<const int32_t*>(a.buf.data());
      const auto* y = static_cast<const int32_t*>(b.buf.data());
      for (int64_t i = 0; i < a.n; ++i)
        if (x[i] != y[i]) {
          std::snprintf(msg, sizeof msg, "output %zu[%lld]: %d != ref %d", s, (long long)i, y[i], x[i]);
          return msg;
        }
      continue;
    }
    const auto* r = static_cast<const float*>(a.buf.data());
    const auto* y = static_cast<const float*>(b.buf.data());
    double err = 0, den = 0;
    for (int64_t i = 0; i < a.n; ++i) {
      const bool special = !std::isfinite(r[i]) || !std::isfinite(y[i]);
      if (special) {
        const bool same = (std::isnan(r[i]) && std::isnan(y[i])) || (std::isinf(r[i]) && r[i] == y[i]);
        if (!same) {
          std::snprintf(msg, sizeof msg, "output %zu[%lld]: %g vs ref %g (NaN/Inf positions differ)", s,
                        (long long)i, y[i], r[i]);
          return msg;
        }
        continue;
      }
      err += (double(y[i]) - r[i]) * (double(y[i]) - r[i]);
      den += double(r[i]) * r[i];
    }
    const double nmse = den > 0 ? err / den : err;
    *nmse_out = std::max(*nmse_out, nmse);
    if (!(nmse <= max_nmse)) {
      std::snprintf(msg, sizeof msg, "output %zu: NMSE %.3g > %.3g", s, nmse, max_nmse);
      return msg;
    }
  }
  return "";
}

CaseList all_cases(const std::string& op_filter) {
  CaseList all;
  for (auto& [name, fn] : case_factories()) {
    CaseList some;
    fn(some);
    for (auto& c : some)
      if (op_filter.empty() || c->op() == op_filter) all.push_back(std::move(c));
  }
  return all;
}

int mode_test(const std::string& op, const std::string& backend, ThreadPool* pool, uint64_t seed,
              bool verbose) {
  int passed = 0, failed = 0;
  const std::vector<BackendSpec> specs = backends();
  GpuSession gpu;
  open_gpu(backend, &gpu);
  if (backend == "cuda" && !gpu.g) return 0;  // skipped, said why
  for (auto& c : all_cases(op)) {
    if (c->perf()) continue;
    Rng rng(seed_of(c->op() + c->shape(), seed));
    c->init(rng);
    RunContext ref;
    ref.pool = pool;
    c->run(Backend::ref, ref);
    for (const BackendSpec& b : specs) {
      if (b.kind == Backend::ref || !c->supports(b.kind)) continue;
      if (!backend.empty() && b.name != backend) continue;
      if (b.kind == Backend::cuda && !gpu.g) continue;
      const CpuLevel old = set_cpu_level_limit(b.level);
      RunContext got;
      got.pool = pool;
      got.gpu = b.kind == Backend::cuda ? gpu.g : nullptr;
      c->run(b.kind, got);
      set_cpu_level_limit(old);
      double nmse = 0;
      std::string why;
      if (b.kind == Backend::cuda) {
        const Status st = got.finish_gpu();
        if (!st.ok()) why = "device error: " + st.message();
      }
      if (why.empty()) why = compare(ref, got, c->max_nmse(), &nmse);
      if (why.empty())
        ++passed;
      else
        ++failed;
      if (!why.empty() || verbose)
        std::printf("  %-12s %-14s %-52s %s (nmse %.2e)\n", c->op().c_str(), b.name.c_str(),
                    c->shape().c_str(), why.empty() ? "OK" : ("FAIL: " + why).c_str(), nmse);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}

// Device time per op run: gpu_run loops of gpu_repeat runs, synchronized, copies excluded.
double time_gpu_runs(OpCase& c, RunContext& ctx) {
  ctx.gpu_repeat = 1;
  c.run(Backend::cuda, ctx);  // warm-up (module load, cuBLAS heuristics)
  if (!ctx.finish_gpu().ok()) return -1;
  ctx.gpu_repeat = 3;
  ctx.gpu_seconds = 0;
  c.run(Backend::cuda, ctx);
  if (!ctx.finish_gpu().ok()) return -1;
  const double one = ctx.gpu_seconds / 3;
  ctx.gpu_repeat = int(std::min(1000.0, std::max(3.0, 0.2 / std::max(one, 1e-7))));
  ctx.gpu_seconds = 0;
  c.run(Backend::cuda, ctx);
  if (!ctx.finish_gpu().ok()) return -1;
  return ctx.gpu_seconds / ctx.gpu_repeat;
}

double time_runs(OpCase& c, Backend b, RunContext& ctx) {
  if (b == Backend::cuda) return time_gpu_runs(c, ctx);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  c.run(b, ctx);  // warm-up (and output allocation); a slow run (the reference) is timed once
  const double first = std::chrono::duration<double>(clock::now() - t0).count();
  if (first > 0.5) return first;
  int n = 0;
  t0 = clock::now();
  double elapsed = 0;
  while (n < 3 || elapsed < 0.3) {
    c.run(b, ctx);
    ++n;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    if (elapsed > 2.0) break;
  }
  return elapsed / n;
}

int mode_perf(const std::string& op, const std::string& backend, ThreadPool* pool, uint64_t seed) {
  std::printf("cpu: %s, threads %d\n", cpu_features_str().c_str(), pool->size());
  GpuSession gpu;
  open_gpu(backend, &gpu);
  if (backend == "cuda" && !gpu.g) return 0;
  if (gpu.g) {
    Result<std::string> d = k3::cuda::describe_device(0);
    std::printf("gpu: %s\n", d.ok() ? d.value().c_str() : d.status().message().c_str());
  }
  for (auto& c : all_cases(op)) {
    if (!c->perf()) continue;
    Rng rng(seed_of(c->op() + c->shape(), seed));
    c->init(rng);
    double t_ref = 0;
    for (const BackendSpec& b : backends()) {
      if (!c->supports(b.kind)) continue;
      if (!backend.empty() && b.name != backend && b.kind != Backend::ref) continue;
      if (b.kind == Backend::cuda && !gpu.g) continue;
      const CpuLevel old = set_cpu_level_limit(b.level);
      RunContext ctx;
      ctx.pool = pool;
      ctx.gpu = b.kind == Backend::cuda ? gpu.g : nullptr;
      const double t = time_runs(*c, b.kind, ctx);
      set_cpu_level_limit(old);
      if (t < 0) {
        std::printf("  %-12s %-14s %-44s device error\n", c->op().c_str(), b.name.c_str(),
                    c->shape().c_str());
        continue;
      }
      if (b.kind == Backend::ref) t_ref = t;
      std::printf("  %-12s %-14s %-44s %10.1f us %8.2f GB/s %8.2f GFLOP/s  x%.1f vs ref\n", c->op().c_str(),
                  b.name.c_str(), c->shape().c_str(), t * 1e6, c->bytes() / t * 1e-9, c->flops() / t * 1e-9,
                  t_ref > 0 ? t_ref / t : 0.0);
    }
  }
  return 0;
}

}  // namespace
}  // namespace k3::opt

int main(int argc, char** argv) {
  using namespace k3::opt;
  CLI::App app{"test-ops: compare op backends with the reference (test), time them (perf), list cases"};
  std::string mode = "test", op, backend;
  int threads = 0;
  uint64_t seed = 1234;
  bool verbose = false;
  app.add_option("mode", mode, "test | perf | list")->check(CLI::IsMember({"test", "perf", "list"}));
  app.add_option("-o,--op", op, "only this op");
  app.add_option("-b,--backend", backend, "only this backend (cpu, cpu-avx512, cpu-portable, cuda)");
  app.add_option("-t,--threads", threads, "thread pool size (0: all cores)");
  app.add_option("--seed", seed, "random seed");
  app.add_flag("-v,--verbose", verbose, "print every comparison, not only failures");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log file even if a failed launch aborts
  k3::ThreadPool pool(threads);
  if (mode == "list") {
    for (auto& c : all_cases(op))
      std::printf("%-12s %-5s %s\n", c->op().c_str(), c->perf() ? "perf" : "test", c->shape().c_str());
    std::printf("backends:");
    for (auto& b : backends()) std::printf(" %s", b.name.c_str());
    std::printf("\n");
    return 0;
  }
  if (mode == "perf") return mode_perf(op, backend, &pool, seed);
  return mode_test(op, backend, &pool, seed, verbose);
}
