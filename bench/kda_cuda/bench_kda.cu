// bench_kda.cu: checks and times the fast KDA kernels (src/ops/kda_fast.h) on the GPU at the K3 shapes
// (96 heads, K = V = 128). Standalone (bench/kda_cuda/build.sh); the GPU-machine script is
// scripts/device/kda_bench.sh, which also times fla's Triton kernels in the same run.
//
//   bench_kda [out.json]
// Correctness: fresh device-random inputs as the model feeds them (q, k l2-normalized, q * K^-1/2, bf16;
// g = -5 sigmoid(z) in bf16; beta in (0, 1); a nonzero carried-in state; cache slots permuted), outputs
// poisoned with NaN first; against the fp64 host references (kda_fast_ref.cpp) on a subset of heads;
// rel-RMS = |x - ref| / |ref| over o and the final state. Timing: CUDA events, median of repeats, inputs
// larger than L2 (decode rotates over several state sets).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/gpu.h"
#include "ops/kda_fast.h"
#include "ops/kda_fast_prefill.cuh"

using namespace k3;
namespace k3::kdapre {  // the pre-pass alone (kda_fast_prefill_intra.cu), timed to split the prefill's time
cudaError_t launch_intra(const KdaPrefillParams& p, uint32_t* ws, int64_t c0, int n_chunk, cudaStream_t st);
}

#define CK(x)                                                                                          \
  do {                                                                                                 \
    cudaError_t e_ = (x);                                                                              \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)
#define ST(x)                                                            \
  do {                                                                   \
    Status s_ = (x);                                                     \
    if (!s_.ok()) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #x, s_.message().c_str()); \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

namespace {

constexpr int H = 96, D = 128;
std::FILE* g_json = nullptr;
bool g_first = true;

void emit(const std::string& metric, double value, const char* unit) {
  std::printf("  %-34s %12.5g %s\n", metric.c_str(), value, unit);
  if (g_json) {
    std::fprintf(g_json, "%s\"%s\": [%.6g, \"%s\"]", g_first ? "{" : ", ", metric.c_str(), value, unit);
    g_first = false;
  }
}

// ---- device-side random inputs ----
__device__ inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ inline float unif(uint64_t seed, uint64_t i) {  // (0, 1)
  return (float(mix(seed * 0x100000001b3ull + i) >> 40) + 0.5f) * (1.f / 16777216.f);
}
__device__ inline float normal(uint64_t seed, uint64_t i) {
  const float u1 = unif(seed, 2 * i), u2 = unif(seed, 2 * i + 1);
  return sqrtf(-2.f * logf(u1)) * cosf(6.2831853f * u2);
}
__device__ inline uint16_t to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ inline float from_bf16(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}
// Rows of 128: l2-normalized, times scale, bf16. One warp per row.
__global__ void gen_unit_rows(uint16_t* x, int64_t rows, float scale, uint64_t seed) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float v[4], ss = 0.f;
  for (int j = 0; j < 4; ++j) {
    v[j] = normal(seed, uint64_t(row) * 128 + lane + 32 * j);
    ss += v[j] * v[j];
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  for (int j = 0; j < 4; ++j) x[row * 128 + lane + 32 * j] = to_bf16(v[j] * rsqrtf(ss) * scale);
}
// kind 0: normal * a (bf16); 1: gate -5 sigmoid(1.5 z - 3.5) (bf16); 2: beta uniform(0.02, 0.98) bf16 values.
__global__ void gen_vals(void* out, int64_t n, int kind, float a, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (kind == 0) {
      static_cast<uint16_t*>(out)[i] = to_bf16(a * normal(seed, i));
    } else if (kind == 1) {
      static_cast<uint16_t*>(out)[i] = to_bf16(-5.f / (1.f + __expf(-(1.5f * normal(seed, i) - 3.5f))));
    } else if (kind == 2) {
      static_cast<float*>(out)[i] = from_bf16(to_bf16(0.02f + 0.96f * unif(seed, i)));
    } else {
      static_cast<float*>(out)[i] = a * normal(seed, i);
    }
  }
}
void gen(void* out, int64_t n, int kind, float a, uint64_t seed) {
  gen_vals<<<2048, 256>>>(out, n, kind, a, seed);
  CK(cudaGetLastError());
}

template <class T>
T* dalloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

struct Rel {
  double num = 0, den = 0;
  int64_t bad = 0;  // NaN / Inf in the checked output
  void add(double x, double ref) {
    if (!std::isfinite(x)) ++bad;
    num += (x - ref) * (x - ref);
    den += ref * ref;
  }
  double value() const { return bad ? INFINITY : std::sqrt(num / std::max(den, 1e-300)); }
};

template <class F>
double time_ms(F&& fn, int warm, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    fn(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- prefill ----
struct PrefillRun {
  std::vector<int> lens;
  int64_t n_tok = 0;
  uint16_t *q, *k, *v, *g, *o;
  float *beta, *S;
  int *cu, *slot;
  int n_slot;
};

PrefillRun make_prefill(const std::vector<int>& lens, uint64_t seed) {
  PrefillRun r;
  r.lens = lens;
  std::vector<int> cu(1, 0), slot;
  for (size_t s = 0; s < lens.size(); ++s) {
    cu.push_back(cu.back() + lens[s]);
  }
  const int n_slot = int(lens.size()) + 2;  // slots: a permutation of the sequences, two slots unused
  int mul = 7;
  while (std::gcd(mul, n_slot) != 1) ++mul;
  for (size_t s = 0; s < lens.size(); ++s) slot.push_back(int((s * mul + 1) % n_slot));
  r.n_tok = cu.back();
  r.n_slot = int(lens.size()) + 2;
  const size_t nk = size_t(r.n_tok) * H * D;
  r.q = dalloc<uint16_t>(nk), r.k = dalloc<uint16_t>(nk), r.v = dalloc<uint16_t>(nk);
  r.g = dalloc<uint16_t>(nk), r.o = dalloc<uint16_t>(nk);
  r.beta = dalloc<float>(size_t(r.n_tok) * H);
  r.S = dalloc<float>(size_t(r.n_slot) * H * D * D);
  r.cu = dalloc<int>(cu.size());
  r.slot = dalloc<int>(slot.size());
  CK(cudaMemcpy(r.cu, cu.data(), cu.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.slot, slot.data(), slot.size() * sizeof(int), cudaMemcpyHostToDevice));
  const int64_t rows = r.n_tok * H;
  gen_unit_rows<<<unsigned((rows * 32 + 255) / 256), 256>>>(r.q, rows, 1.f / std::sqrt(float(D)), seed + 1);
  gen_unit_rows<<<unsigned((rows * 32 + 255) / 256), 256>>>(r.k, rows, 1.f, seed + 2);
  CK(cudaGetLastError());
  gen(r.v, int64_t(nk), 0, 1.f, seed + 3);
  gen(r.g, int64_t(nk), 1, 0.f, seed + 4);
  gen(r.beta, rows, 2, 0.f, seed + 5);
  gen(r.S, int64_t(r.n_slot) * H * D * D, 3, 0.05f, seed + 6);
  CK(cudaDeviceSynchronize());
  return r;
}

void free_prefill(PrefillRun& r) {
  for (void* p : {(void*)r.q, (void*)r.k, (void*)r.v, (void*)r.g, (void*)r.o, (void*)r.beta, (void*)r.S,
                  (void*)r.cu, (void*)r.slot})
    CK(cudaFree(p));
}

KdaPrefillParams params_of(const PrefillRun& r) {
  KdaPrefillParams p;
  p.n_seq = int(r.lens.size());
  p.n_tok = r.n_tok;
  p.n_head = H;
  p.cu_seqlens = r.cu;
  p.q = r.q, p.k = r.k, p.v = r.v, p.g = r.g, p.beta = r.beta, p.S = r.S, p.slot = r.slot, p.o = r.o;
  return p;
}

// The pre-pass scratch of chunk 0 of head h (a run whose first chunk is full) against fp64 on the host:
// undoes the fragment layouts of kda_fast_prefill.cuh and prints rel-RMS per matrix.
void check_scratch(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                   const std::vector<uint16_t>& g, const std::vector<float>& beta, int h, const GpuContext& ctx) {
  using namespace k3::kdapre;
  std::vector<uint32_t> w(CHUNK_WORDS);
  CK(cudaMemcpy(w.data(), static_cast<const uint32_t*>(ctx.workspace) + size_t(h) * CHUNK_WORDS,
                CHUNK_WORDS * 4, cudaMemcpyDeviceToHost));
  auto X = [&](const std::vector<uint16_t>& a, int i, int d) { return double(bf16_to_f32(a[(size_t(i) * H + h) * D + d])); };
  std::vector<double> G(64 * 128), Qe(64 * 128), Kd(64 * 128), A(64 * 64, 0.0), L(64 * 64, 0.0), T(64 * 64, 0.0);
  for (int d = 0; d < 128; ++d) {
    double acc = 0;
    for (int i = 0; i < 64; ++i) acc += X(g, i, d), G[i * 128 + d] = acc;
  }
  for (int i = 0; i < 64; ++i)
    for (int d = 0; d < 128; ++d) {
      Qe[i * 128 + d] = std::exp(G[i * 128 + d]) * X(q, i, d);
      Kd[i * 128 + d] = std::exp(G[63 * 128 + d] - G[i * 128 + d]) * X(k, i, d);
    }
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j <= i; ++j) {
      double a = 0, l = 0;
      for (int d = 0; d < 128; ++d) {
        const double e = std::exp(G[i * 128 + d] - G[j * 128 + d]);
        a += X(q, i, d) * X(k, j, d) * e, l += X(k, i, d) * X(k, j, d) * e;
      }
      A[i * 64 + j] = a;
      if (j < i) L[i * 64 + j] = beta[size_t(i) * H + h] * l;
    }
  for (int i = 0; i < 64; ++i)  // T = (I + L)^-1 by forward substitution, row by row
    for (int j = 0; j <= i; ++j) {
      double s = i == j ? 1.0 : 0.0;
      for (int m = j; m < i; ++m) s -= L[i * 64 + m] * T[m * 64 + j];
      T[i * 64 + j] = s;
    }
  std::vector<double> W(64 * 128, 0.0), U(64 * 128, 0.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j <= i; ++j) {
      const double b = beta[size_t(j) * H + h];
      for (int d = 0; d < 128; ++d) {
        W[i * 128 + d] += T[i * 64 + j] * b * std::exp(G[j * 128 + d]) * X(k, j, d);
        U[i * 128 + d] += T[i * 64 + j] * b * X(v, j, d);
      }
    }
  // fp16 fragment (tile, k-step) element r of lane l -> (row, col); two k-steps per 16-byte lane slot.
  auto afrag = [&](int off, int n_tile, int n_step, auto ref, bool neg, const char* name, bool lower) {
    Rel e;
    for (int mt = 0; mt < n_tile; ++mt)
      for (int ks = 0; ks < n_step; ++ks) {
        if (lower && ks >= 2 * mt + 2) continue;
        for (int l = 0; l < 32; ++l)
          for (int r = 0; r < 4; ++r) {
            const int row = 16 * mt + (l >> 2) + 8 * (r & 1), col = 8 * ks + (l & 3) + 4 * (r >> 1);
            const uint32_t word = w[off + ((mt * (n_step / 2) + ks / 2) * 32 + l) * 4 + (ks & 1) * 2 + (r >> 1)];
            __half_raw hr;
            hr.x = uint16_t(r & 1 ? word >> 16 : word & 0xffff);
            const float x = __half2float(__half(hr));
            e.add(neg ? -x : x, ref(row, col));
          }
      }
    std::printf("  scratch %s rel-RMS %.3g\n", name, e.value());
  };
  afrag(OFF_QE, 4, 16, [&](int i, int d) { return Qe[i * 128 + d]; }, false, "Qe", false);
  afrag(OFF_WN, 4, 16, [&](int i, int d) { return W[i * 128 + d]; }, true, "W", false);
  afrag(OFF_KT, 8, 8, [&](int d, int i) { return Kd[i * 128 + d]; }, false, "Kd^T", false);
  afrag(OFF_AF, 4, 8, [&](int i, int j) { return A[i * 64 + j]; }, false, "A", true);
  afrag(OFF_TF, 4, 8, [&](int i, int j) { return T[i * 64 + j]; }, false, "T", true);
  Rel ed;
  for (int d = 0; d < 128; ++d) ed.add(*reinterpret_cast<const float*>(&w[OFF_DC + d]), std::exp(G[63 * 128 + d]));
  std::printf("  scratch exp(G_C) rel-RMS %.3g (U unused: %g)\n", ed.value(), U[0] * 0);
}

// Runs once on poisoned outputs and compares heads `heads` of every sequence with the fp64 reference.
void check_prefill(const std::string& name, const std::vector<int>& lens, const std::vector<int>& heads,
                   GpuContext& ctx, bool zero_state = false) {
  PrefillRun r = make_prefill(lens, 1000 + lens.size() * 7 + lens[0]);
  KdaPrefillParams p = params_of(r);
  p.zero_initial_state = zero_state;
  const size_t nk = size_t(r.n_tok) * H * D, ns = size_t(r.n_slot) * H * D * D;
  CK(cudaMemset(r.o, 0xff, nk * 2));  // NaN bf16 everywhere
  const std::vector<float> S0 = to_host(r.S, ns);
  ST(kda_prefill_fast_cuda(p, ctx));
  CK(cudaDeviceSynchronize());
  const auto o = to_host(r.o, nk), q = to_host(r.q, nk), k = to_host(r.k, nk), v = to_host(r.v, nk),
             g = to_host(r.g, nk);
  const auto beta = to_host(r.beta, size_t(r.n_tok) * H);
  const auto S1 = to_host(r.S, ns);
  std::vector<int> cu(1, 0), slot(lens.size());
  for (int l : lens) cu.push_back(cu.back() + l);
  CK(cudaMemcpy(slot.data(), r.slot, slot.size() * sizeof(int), cudaMemcpyDeviceToHost));
  if (kda_prefill_split_enabled() && lens.size() == 1 && lens[0] >= 64 && lens[0] <= 1024)
    check_scratch(q, k, v, g, beta, 5, ctx);
  int64_t unwritten = 0;
  for (uint16_t x : o)
    if (!std::isfinite(bf16_to_f32(x))) ++unwritten;
  // One host thread per checked head: extract the head (n_head = 1) and run the fp64 reference.
  std::vector<std::vector<uint16_t>> oref(heads.size());
  std::vector<std::vector<float>> Sref(heads.size());
  std::vector<std::thread> th;
  for (size_t hi = 0; hi < heads.size(); ++hi)
    th.emplace_back([&, hi] {
      const int h = heads[hi];
      const int64_t T = r.n_tok;
      std::vector<uint16_t> qh(size_t(T) * D), kh(qh.size()), vh(qh.size()), gh(qh.size());
      std::vector<float> bh(static_cast<size_t>(T)), Sh(size_t(r.n_slot) * D * D);
      for (int64_t t = 0; t < T; ++t) {
        const size_t src = (size_t(t) * H + h) * D;
        std::copy_n(&q[src], D, &qh[size_t(t) * D]);
        std::copy_n(&k[src], D, &kh[size_t(t) * D]);
        std::copy_n(&v[src], D, &vh[size_t(t) * D]);
        std::copy_n(&g[src], D, &gh[size_t(t) * D]);
        bh[size_t(t)] = beta[size_t(t) * H + h];
      }
      for (int s = 0; s < r.n_slot; ++s)
        std::copy_n(&S0[(size_t(s) * H + h) * D * D], D * D, &Sh[size_t(s) * D * D]);
      oref[hi].resize(qh.size());
      KdaPrefillParams rp;
      rp.n_seq = int(lens.size()), rp.n_tok = T, rp.n_head = 1;
      rp.cu_seqlens = cu.data(), rp.slot = slot.data();
      rp.q = qh.data(), rp.k = kh.data(), rp.v = vh.data(), rp.g = gh.data(), rp.beta = bh.data();
      rp.S = Sh.data(), rp.o = oref[hi].data(), rp.zero_initial_state = zero_state;
      kda_prefill_fast_ref(rp);
      Sref[hi] = std::move(Sh);
    });
  for (auto& t : th) t.join();
  Rel eo, es, ec[4], er[8];  // ec: tokens by chunk (0..3), er: by row block of 16 within chunk 0 and 1
  for (size_t hi = 0; hi < heads.size(); ++hi) {
    const int h = heads[hi];
    for (int64_t t = 0; t < r.n_tok; ++t)
      for (int c = 0; c < D; ++c) {
        const double x = bf16_to_f32(o[(size_t(t) * H + h) * D + c]),
                     y = bf16_to_f32(oref[hi][size_t(t) * D + c]);
        eo.add(x, y);
        if (t < 256) ec[t / 64].add(x, y);
        if (t < 128) er[t / 16].add(x, y);
      }
    for (int s : slot)
      for (int e = 0; e < D * D; ++e)
        es.add(S1[(size_t(s) * H + h) * D * D + e], Sref[hi][size_t(s) * D * D + e]);
  }
  std::printf("check %s: %zu heads vs fp64, unwritten/non-finite o: %lld\n", name.c_str(), heads.size(),
              (long long)unwritten);
  std::printf("  by chunk:");
  for (auto& e : ec) std::printf(" %.3g", e.den > 0 ? e.value() : 0.0);
  std::printf("  by 16-row block of chunks 0-1:");
  for (auto& e : er) std::printf(" %.3g", e.den > 0 ? e.value() : 0.0);
  std::printf("\n");
  emit("prefill_" + name + "_relrms_o", unwritten ? INFINITY : eo.value(), "rel");
  emit("prefill_" + name + "_relrms_state", es.value(), "rel");
  free_prefill(r);
}

void time_prefill(const std::string& name, const std::vector<int>& lens, int reps, GpuContext& ctx) {
  PrefillRun r = make_prefill(lens, 77);
  KdaPrefillParams p = params_of(r);
  const double ms = time_ms([&](int) { ST(kda_prefill_fast_cuda(p, ctx)); }, 2, reps);
  if (kda_prefill_split_enabled()) {  // the pre-pass alone over all windows (total time in one buffer)
    // The intra kernels alone over the same windows (as kda_prefill_fast_cuda cuts them).
    const int64_t max_chunks = r.n_tok / 64 + int64_t(lens.size());
    const int64_t window = std::min<int64_t>(max_chunks, ctx.workspace_bytes / kda_prefill_fast_workspace_bytes(H));
    const double ms_intra = time_ms(
        [&](int) {
          for (int64_t c0 = 0; c0 < max_chunks; c0 += window)
            CK(kdapre::launch_intra(p, static_cast<uint32_t*>(ctx.workspace), c0,
                                    int(std::min(window, max_chunks - c0)), nullptr));
        },
        2, reps);
    emit("prefill_" + name + "_intra_ms", ms_intra, "ms");
  }
  const double bytes = double(r.n_tok) * H * (4.0 * D * 2 + 4) + 2.0 * lens.size() * H * D * D * 4;
  emit("prefill_" + name + "_ms", ms, "ms");
  emit("prefill_" + name + "_GBps", bytes / ms * 1e-6, "GB/s");
  free_prefill(r);
}

// ---- decode ----
struct DecodeRun {
  int n_seq, n_slot;
  uint16_t *qkv, *f, *b, *gate, *conv, *out;
  float *conv_w, *dt_bias, *A_log, *o_norm, *S;
  int* slot;
};

DecodeRun make_decode(int n_seq, int n_slot, uint64_t seed) {
  DecodeRun r;
  r.n_seq = n_seq, r.n_slot = n_slot;
  const size_t HK = size_t(H) * D;
  r.qkv = dalloc<uint16_t>(n_seq * 3 * HK), r.f = dalloc<uint16_t>(n_seq * HK);
  r.b = dalloc<uint16_t>(size_t(n_seq) * H), r.gate = dalloc<uint16_t>(n_seq * HK);
  r.conv = dalloc<uint16_t>(size_t(n_slot) * 9 * HK), r.out = dalloc<uint16_t>(n_seq * HK);
  r.conv_w = dalloc<float>(3 * HK * 4), r.dt_bias = dalloc<float>(HK), r.A_log = dalloc<float>(H);
  r.o_norm = dalloc<float>(D), r.S = dalloc<float>(size_t(n_slot) * H * D * D);
  r.slot = dalloc<int>(size_t(n_slot));
  gen(r.qkv, int64_t(n_seq * 3 * HK), 0, 1.f, seed + 1);
  gen(r.f, int64_t(n_seq * HK), 0, 1.f, seed + 2);
  gen(r.b, int64_t(n_seq) * H, 0, 1.f, seed + 3);
  gen(r.gate, int64_t(n_seq * HK), 0, 1.f, seed + 4);
  gen(r.conv, int64_t(n_slot) * 9 * HK, 0, 1.f, seed + 5);
  gen(r.conv_w, int64_t(3 * HK * 4), 3, 0.5f, seed + 6);
  gen(r.dt_bias, int64_t(HK), 3, 1.f, seed + 7);
  gen(r.A_log, H, 3, 0.5f, seed + 8);
  gen(r.o_norm, D, 3, 0.3f, seed + 9);
  gen(r.S, int64_t(n_slot) * H * D * D, 3, 0.05f, seed + 10);
  std::vector<int> slot(static_cast<size_t>(
      n_slot));  // a permutation: sequence b of launch i uses slot[(i*n_seq + b) % n_slot]
  for (int i = 0; i < n_slot; ++i) slot[size_t(i)] = int((int64_t(i) * 7 + 3) % n_slot);
  CK(cudaMemcpy(r.slot, slot.data(), slot.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  return r;
}

KdaDecodeParams params_of(const DecodeRun& r) {
  KdaDecodeParams p;
  p.n_seq = r.n_seq, p.n_head = H;
  p.qkv = r.qkv, p.conv_w = r.conv_w, p.f = r.f, p.dt_bias = r.dt_bias, p.A_log = r.A_log, p.b = r.b;
  p.gate = r.gate, p.o_norm = r.o_norm, p.slot = r.slot, p.S = r.S, p.conv = r.conv, p.out = r.out;
  return p;
}

void free_decode(DecodeRun& r) {
  for (void* p :
       {(void*)r.qkv, (void*)r.f, (void*)r.b, (void*)r.gate, (void*)r.conv, (void*)r.out, (void*)r.conv_w,
        (void*)r.dt_bias, (void*)r.A_log, (void*)r.o_norm, (void*)r.S, (void*)r.slot})
    CK(cudaFree(p));
}

void check_decode(int n_seq, GpuContext& ctx) {
  DecodeRun r = make_decode(n_seq, n_seq + 3, 500 + n_seq);
  KdaDecodeParams p = params_of(r);
  const size_t HK = size_t(H) * D, ns = size_t(r.n_slot) * H * D * D, nc = size_t(r.n_slot) * 9 * HK;
  CK(cudaMemset(r.out, 0xff, n_seq * HK * 2));
  // Host copies of every input (the reference runs on them in place).
  KdaDecodeParams hp = p;
  auto qkv = to_host(r.qkv, n_seq * 3 * HK), f = to_host(r.f, n_seq * HK),
       b = to_host(r.b, size_t(n_seq) * H), gate = to_host(r.gate, n_seq * HK), conv = to_host(r.conv, nc);
  std::vector<uint16_t> out(n_seq * HK);
  auto conv_w = to_host(r.conv_w, 3 * HK * 4), dt_bias = to_host(r.dt_bias, HK),
       A_log = to_host(r.A_log, size_t(H)), o_norm = to_host(r.o_norm, size_t(D)), S = to_host(r.S, ns);
  auto slot = to_host(r.slot, size_t(r.n_slot));
  hp.qkv = qkv.data(), hp.f = f.data(), hp.b = b.data(), hp.gate = gate.data(), hp.conv = conv.data();
  hp.out = out.data(), hp.conv_w = conv_w.data(), hp.dt_bias = dt_bias.data(), hp.A_log = A_log.data();
  hp.o_norm = o_norm.data(), hp.S = S.data(), hp.slot = slot.data();
  ST(kda_decode_fast_cuda(p, ctx));
  CK(cudaDeviceSynchronize());
  kda_decode_fast_ref(hp);
  const auto out_d = to_host(r.out, n_seq * HK), conv_d = to_host(r.conv, nc);
  const auto S_d = to_host(r.S, ns);
  Rel eo, es;
  for (size_t i = 0; i < out.size(); ++i) eo.add(bf16_to_f32(out_d[i]), bf16_to_f32(out[i]));
  for (size_t i = 0; i < S.size(); ++i) es.add(S_d[i], S[i]);
  int64_t conv_diff = 0;
  for (size_t i = 0; i < conv.size(); ++i) conv_diff += conv[i] != conv_d[i];
  std::printf("check decode b=%d: conv window entries differing: %lld\n", n_seq, (long long)conv_diff);
  const std::string tag = "decode_b" + std::to_string(n_seq);
  emit(tag + "_relrms_out", eo.value(), "rel");
  emit(tag + "_relrms_state", es.value(), "rel");
  emit(tag + "_conv_mismatch", double(conv_diff), "count");
  free_decode(r);
}

void time_decode(int n_seq, double copy_GBps, GpuContext& ctx) {
  const int sets = n_seq == 1 ? 32 : 2;  // rotate state sets so that L2 (60 MB) does not hold them
  DecodeRun r = make_decode(n_seq, n_seq * sets, 900 + n_seq);
  std::vector<KdaDecodeParams> ps;
  for (int i = 0; i < sets; ++i) {
    ps.push_back(params_of(r));
    ps.back().slot = r.slot + i * n_seq;
  }
  const int inner = 100;
  const double ms = time_ms(
      [&](int) {
        for (int i = 0; i < inner; ++i) ST(kda_decode_fast_cuda(ps[size_t(i % sets)], ctx));
      },
      1, 9);
  const double us = ms * 1000.0 / inner;
  const double state_bytes = 2.0 * n_seq * H * D * D * 4;
  const std::string tag = "decode_b" + std::to_string(n_seq);
  emit(tag + "_us", us, "us");
  emit(tag + "_state_GBps", state_bytes / us * 1e-3, "GB/s");
  if (copy_GBps > 0) emit(tag + "_state_frac_of_copy", state_bytes / us * 1e-3 / copy_GBps, "ratio");
  free_decode(r);
}

double copy_bandwidth() {
  const size_t n = size_t(2) << 30;
  char *a = dalloc<char>(n), *b = dalloc<char>(n);
  CK(cudaMemset(a, 1, n));
  const double ms = time_ms([&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); }, 2, 10);
  CK(cudaFree(a));
  CK(cudaFree(b));
  const double gbps = 2.0 * double(n) / ms * 1e-6;
  emit("copy_GBps", gbps, "GB/s");
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_json = std::fopen(argv[1], "w");
  const std::string only = argc > 2 ? argv[2] : "all";
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  GpuContext ctx;  // ctx.stream = nullptr: the legacy stream, which the events of time_ms order with
  // The prefill's scratch: the model's default workspace (256 MiB, src/gpu/context.h) unless K3_KDA_WS_MB says.
  const char* ws_env = std::getenv("K3_KDA_WS_MB");
  ctx.workspace_bytes = size_t(ws_env ? std::atoi(ws_env) : 256) << 20;
  CK(cudaMalloc(&ctx.workspace, ctx.workspace_bytes));
  std::printf("prefill: %s; workspace %zu MiB = %zu chunks of 96 heads\n",
              kda_prefill_split_enabled() ? "two-kernel (default)" : "one-kernel (K3_KDA_PREFILL_SPLIT=0)",
              ctx.workspace_bytes >> 20, ctx.workspace_bytes / kda_prefill_fast_workspace_bytes(H));
  // Rejection of an unsupported shape is a message, not a launch.
  {
    KdaPrefillParams bad;
    bad.n_head = 96, bad.d_k = 64;
    Status s = kda_prefill_fast_cuda(bad, ctx);
    std::printf("bad shape -> %s\n", s.ok() ? "accepted (WRONG)" : s.message().c_str());
  }
  if (only == "all" || only == "check" || only == "quick") {
    check_prefill("T16z", {16}, {0, 5, 95}, ctx, true);  // one 16-row block, no carried state
    check_prefill("T64z", {64}, {0, 5, 95}, ctx, true);  // one full chunk
    check_prefill("T100", {100}, {0, 5, 95}, ctx);
    check_prefill("varlen", {1024, 1, 63, 65, 1000, 777, 64, 128}, {0, 40, 95}, ctx);
    check_prefill("T8192", {8192}, {0, 31, 95}, ctx);
    check_decode(1, ctx);
    check_decode(64, ctx);
  }
  if (only == "decode") {  // decode only: checks, then times (helper kdadec's device script)
    check_decode(1, ctx);
    check_decode(64, ctx);
    const double copy = copy_bandwidth();
    for (int rep = 0; rep < 2; ++rep) {  // twice: the spread between the two is the noise
      time_decode(1, copy, ctx);
      time_decode(64, copy, ctx);
    }
  }
  if (only == "prefill") {  // prefill timings alone (variants of the same build)
    time_prefill("T2048", {2048}, 20, ctx);
    time_prefill("T8192", {8192}, 20, ctx);
    time_prefill("varlen8x1024", std::vector<int>(8, 1024), 20, ctx);
    time_prefill("T131072", {131072}, 5, ctx);
  }
  if (only == "all" || only == "time" || only == "quick") {
    const double copy = copy_bandwidth();
    time_prefill("T2048", {2048}, 20, ctx);
    time_prefill("T8192", {8192}, 20, ctx);
    time_prefill("varlen8x1024", std::vector<int>(8, 1024), 20, ctx);
    if (only != "quick") time_prefill("T131072", {131072}, 5, ctx);
    time_decode(1, copy, ctx);
    time_decode(64, copy, ctx);
  }
  if (g_json) {
    std::fprintf(g_json, "}\n");
    std::fclose(g_json);
  }
  return 0;
}
