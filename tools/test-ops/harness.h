// harness.h: the op test harness (test-ops). Every op backend is compared with the plain reference.
//
// A test case (a subclass of OpCase) owns its inputs and runs one op on one backend:
//   op()            op name, the -o filter matches it ("linear", "rms_norm", ...)
//   shape()         a short description: "n_tok=17 in=96 out=40 w=bf16 ldx=104"
//   init(rng)       makes the inputs (op-specific ranges: gates in (-5, 0), beta in (0, 1), ...)
//   run(b, ctx)     runs the op on backend b (Backend::ref, cpu, cuda) writing every output into
//                   ctx.out_f32(slot, n) / ctx.out_i32(slot, n) buffers (same slots, same sizes per backend)
//   max_nmse()      per-case bound on sum((y - y_ref)^2) / sum(y_ref^2), per fp32 output slot
//   supports(b)     default: ref and cpu
//   bytes(), flops()  for `perf` (GB/s, GFLOP/s); perf() says whether the case is a perf shape
//
// Checks per output slot: NaN and Inf positions match the reference exactly (sign of Inf too), NMSE of
// the finite values <= max_nmse(), i32 slots are equal, and the 64 guard bytes after every output buffer
// are untouched. Output buffers are pre-filled with a NaN pattern, so an element one backend writes and
// the other skips is caught too.
//
// The cuda backend (built with -DK3_CUDA=ON, skipped with "no CUDA device" when none is visible): run(cuda,
// ctx) uploads its inputs (ctx.dev_in), gets device outputs that mirror the guarded host buffers
// (ctx.dev_out_f32: the device buffer starts as a copy of the host buffer, NaN fill, anything the case wrote
// there such as an in/out state, AND the 64 guard bytes) and enqueues the op through ctx.gpu_run. The
// harness then downloads each mirror whole into its host buffer, so the device-side guard bytes are
// checked by the usual guard check, and frees the device memory. In `perf`, gpu_run runs the op
// ctx.gpu_repeat times back to back and times only that (no copies). Cases put their cuda branch under
// #ifdef K3_HAVE_CUDA and pass kCudaBuilt as FnCase's `cuda` flag (or override supports()).
//
// Registration, from any tools/test-ops/cases_*.cpp (no header edits needed):
//   K3_OP_CASES(linear_cases) { cases.push_back(std::make_unique<LinearCase>(...)); }
// FnCase (below) builds a case from an init and a run closure; cases_norm.cpp shows it.
// The cpu backend runs at every CPU level this machine has (cpu = best, cpu-avx512, cpu-portable), so the
// portable fallback is always covered. Usage: test-ops test|perf|list [-o OP] [-b BACKEND] [-t THREADS]
// [--seed N] [-v]. `test` runs the cases with perf() == false, prints failures (-v: every comparison) and
// a last line "N passed, M failed"; it exits 1 when M > 0 or N == 0. `perf` runs the perf() == true cases
// on every backend and prints time, GB/s, GFLOP/s and the speed-up over ref. Inputs come from a seed
// derived from op + shape, so a failing case reproduces alone with -o.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {
class ThreadPool;
}

namespace k3::opt {

enum class Backend { ref, cpu, cuda };

#ifdef K3_HAVE_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif

// A guarded output buffer: n elements then 64 canary bytes.
struct GuardedBuffer {
  std::vector<uint8_t> bytes;
  size_t n_bytes = 0;
  void alloc(size_t n, uint32_t fill_pattern, size_t elem_size);
  bool guard_intact() const;
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

class RunContext {
 public:
  RunContext() = default;
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;
  ~RunContext();

  ThreadPool* pool = nullptr;
  // Output slot `slot` with n elements; the same slot must get the same n on every backend.
  float* out_f32(int slot, int64_t n);
  int32_t* out_i32(int slot, int64_t n);

  // ---- cuda backend (harness_gpu.cpp) ----
  GpuContext* gpu = nullptr;  // set by the harness for Backend::cuda
  int gpu_repeat = 1;         // perf: op runs per gpu_run
  double gpu_seconds = 0;     // perf: wall time of the gpu_run loops (synchronized), summed
  // Device copy of host data (freed by finish_gpu); n elements of T.
  template <class T>
  const T* dev_in(const T* host, int64_t n) {
    return static_cast<const T*>(dev_upload(host, size_t(n) * sizeof(T)));
  }
  template <class T>
  const T* dev_in(const std::vector<T>& v) {
    return dev_in(v.data(), int64_t(v.size()));
  }
  // Device mirror of out_f32(slot, n) / out_i32(slot, n) (see the file comment); call it after writing any
  // initial contents into the host buffer.
  float* dev_out_f32(int slot, int64_t n);
  int32_t* dev_out_i32(int slot, int64_t n);
  // Enqueues `op` (gpu_repeat times in perf) on gpu->stream.
  void gpu_run(const std::function<void()>& op);
  // Waits, downloads every mirror (guard bytes included) into its host buffer, frees the device memory.
  // A failed kernel shows up here.
  Status finish_gpu();

  struct Slot {
    GuardedBuffer buf;
    int64_t n = 0;
    bool is_f32 = true;
  };
  std::vector<Slot> slots;

 private:
  Slot& slot_at(int slot, int64_t n, bool is_f32);
  void* dev_upload(const void* host, size_t bytes);
  void* dev_mirror(int slot);
  struct Mirror {
    int slot;
    void* dev;
  };
  std::vector<void*> dev_allocs_;
  std::vector<Mirror> mirrors_;
  Status gpu_status_;  // the first failure of an upload / launch, reported by finish_gpu
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  float normal(float mean = 0, float std = 1) { return std::normal_distribution<float>(mean, std)(gen_); }
  uint32_t bits() { return uint32_t(gen_()); }
  int64_t below(int64_t n) { return int64_t(gen_() % uint64_t(n)); }

 private:
  std::mt19937_64 gen_;
};

// Fill helpers: n values (a row stride ld > width leaves the gaps filled too, with the same law).
void fill_uniform(Rng& rng, float* x, int64_t n, float lo, float hi);
void fill_normal(Rng& rng, float* x, int64_t n, float std = 1.0f);
// Uniform in (lo, hi) then rounded to bf16 (the activations the model feeds ops in bf16 mode).
void fill_uniform_bf16(Rng& rng, float* x, int64_t n, float lo, float hi);

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string op() const = 0;
  virtual std::string shape() const = 0;
  virtual void init(Rng& rng) = 0;
  virtual void run(Backend b, RunContext& ctx) = 0;
  virtual double max_nmse() const { return 1e-7; }
  virtual bool supports(Backend b) const { return b == Backend::ref || b == Backend::cpu; }
  virtual bool perf() const { return false; }
  virtual double bytes() const { return 0; }
  virtual double flops() const { return 0; }
};

// A case from two closures, for ops whose state fits in a lambda capture (see cases_norm.cpp):
//   auto st = std::make_shared<State>(...);
//   cases.push_back(std::make_unique<FnCase>("rms_norm", "n_row=17 d=64", 1e-10,
//       [st](Rng& rng) { ...fill st... }, [st](Backend b, RunContext& ctx) { ...run... }));
class FnCase : public OpCase {
 public:
  FnCase(std::string op, std::string shape, double max_nmse, std::function<void(Rng&)> init,
         std::function<void(Backend, RunContext&)> run, bool perf = false, double bytes = 0, double flops = 0,
         bool cuda = false)
      : op_(std::move(op)),
        shape_(std::move(shape)),
        max_nmse_(max_nmse),
        init_(std::move(init)),
        run_(std::move(run)),
        perf_(perf),
        bytes_(bytes),
        flops_(flops),
        cuda_(cuda) {}
  std::string op() const override { return op_; }
  std::string shape() const override { return shape_; }
  void init(Rng& rng) override { init_(rng); }
  void run(Backend b, RunContext& ctx) override { run_(b, ctx); }
  double max_nmse() const override { return max_nmse_; }
  bool supports(Backend b) const override { return b != Backend::cuda || cuda_; }
  bool perf() const override { return perf_; }
  double bytes() const override { return bytes_; }
  double flops() const override { return flops_; }

 private:
  std::string op_, shape_;
  double max_nmse_;
  std::function<void(Rng&)> init_;
  std::function<void(Backend, RunContext&)> run_;
  bool perf_;
  double bytes_, flops_;
  bool cuda_;
};

using CaseList = std::vector<std::unique_ptr<OpCase>>;
using CaseFactory = void (*)(CaseList& cases);

struct CaseRegistrar {
  CaseRegistrar(const char* name, CaseFactory fn);
};
std::vector<std::pair<std::string, CaseFactory>>& case_factories();

}  // namespace k3::opt

#define K3_OP_CASES(name)                                              \
  static void name(::k3::opt::CaseList& cases);                        \
  static const ::k3::opt::CaseRegistrar name##_registrar(#name, name); \
  static void name(::k3::opt::CaseList& cases)
