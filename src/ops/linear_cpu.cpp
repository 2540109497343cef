// linear_cpu.cpp: the fast CPU linear (linear.h): dispatch on the run-time CPU level, the work split over
// the thread pool, and the portable kernel (plain C++, any CPU) that the AVX-512 kernels must agree with.
//
//   y[t, o] = sum_i x[t, i] * W[o, i]      fp32 accumulation, per 32-column chunk:
//   partial = sum_{i in chunk} x[t, i] * w[o, i];  acc += partial (MXFP4: acc += partial * 2^(e-127))
//
// Threads take chunks of whole row tiles from a shared counter (dynamic: a descheduled thread does not hold
// up the call); tokens are blocked (linear_kernels.h). Which thread computes a row changes no value. The bf16 path
// (bf16 weights, Precision::bf16 input, a CPU with AVX512_BF16) first copies x to bf16 in a thread-local
// scratch buffer that only grows (no allocation per call once warm). Subnormal fp32/bf16 weights are
// exact but slow on the fp32 path (FMA assists); checkpoints have almost none.
//
// Diagnostic switch (never on by default): K3_LINEAR_X_BF16=1 in the environment, read once, makes every
// bf16-weight linear round its fp32 input to bf16 first (round to nearest even), as ggml's bf16 matmul does
// (its vec_dot_type for bf16 is bf16: src1 is converted before the dot products). Used to explain the logits
// gap against llama.cpp (docs/decisions.md); it breaks fp32 mode's exactness on purpose.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/env.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/linear.h"
#include "ops/linear_kernels.h"

namespace k3 {

namespace linear_detail {

namespace {

constexpr int kChunk = 32;

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, em = h & 0x7fff;
  uint32_t u;
  if (em >= 0x7c00) u = sign | 0x7f800000u | ((em & 0x3ff) << 13);   // inf / NaN
  else if (em >= 0x0400) u = sign | ((em << 13) + ((127 - 15) << 23));  // normal
  else {                                                                // subnormal: em * 2^-24
    float f = float(em) * 5.9604644775390625e-08f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int b = 0; b < 256; ++b) v[b] = f8_e4m3_to_f32(uint8_t(b));
  }
};

// W[row, col0 .. col0+n) to fp32; MXFP4 elements come out WITHOUT their scale (mag only), n <= 32,
// and a chunk never straddles a 32-group.
void decode_unscaled(const LinearWeight& W, int64_t row, int64_t col0, int n, float* out) {
  if (W.is_mxfp4()) {  // col0 and n are even here (in % 32 == 0): one byte gives two columns
    static constexpr float kE2m1[16] = {0.f,  .5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                        -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
    const uint8_t* b = static_cast<const uint8_t*>(W.w) + row * (W.in / 2) + col0 / 2;
    for (int k = 0; k < n; k += 2) {
      out[k] = kE2m1[b[k / 2] & 0x0f];
      out[k + 1] = kE2m1[b[k / 2] >> 4];
    }
    return;
  }
  const int64_t base = row * W.in + col0;
  switch (W.dtype) {
    case DType::f32: std::memcpy(out, static_cast<const float*>(W.w) + base, size_t(n) * 4); break;
    case DType::bf16: {
      const uint16_t* w = static_cast<const uint16_t*>(W.w) + base;
      for (int k = 0; k < n; ++k) out[k] = bf16_to_f32(w[k]);
      break;
    }
    case DType::f16: {
      const uint16_t* w = static_cast<const uint16_t*>(W.w) + base;
      for (int k = 0; k < n; ++k) out[k] = f16_bits_to_f32(w[k]);
      break;
    }
    case DType::f8_e4m3: {
      static const Fp8Table table;
      const uint8_t* w = static_cast<const uint8_t*>(W.w) + base;
      for (int k = 0; k < n; ++k) out[k] = table.v[w[k]];
      break;
    }
    default: K3_ASSERT(!"linear: unsupported weight dtype");
  }
}

inline float dot(const float* a, const float* b, int n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[k + l] * b[k + l];
  for (; k < n; ++k) s[k % 8] += a[k] * b[k];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <int RB, int TB>
struct PortableTile {
  static void run(const Job& j, int64_t r0, int64_t t0) {
    const LinearWeight& W = *j.W;
    float acc[RB][TB] = {};
    float w[RB][kChunk];
    for (int64_t c = 0; c < W.in; c += kChunk) {
      const int n = int(std::min<int64_t>(kChunk, W.in - c));
      float scale[RB] = {};
      for (int r = 0; r < RB; ++r) {
        decode_unscaled(W, r0 + r, c, n, w[r]);
        if (W.is_mxfp4()) {
          const uint32_t bits = e8m0_bits(W.scale[(r0 + r) * (W.in / 32) + c / 32]);
          std::memcpy(&scale[r], &bits, 4);
        }
      }
      for (int t = 0; t < TB; ++t) {
        const float* x = j.x + (t0 + t) * j.ldx + c;
        for (int r = 0; r < RB; ++r) {
          const float partial = dot(w[r], x, n);
          acc[r][t] += W.is_mxfp4() ? partial * scale[r] : partial;
        }
      }
    }
    for (int t = 0; t < TB; ++t)
      for (int r = 0; r < RB; ++r) j.y[(t0 + t) * j.ldy + r0 + r] = acc[r][t];
  }
};

}  // namespace

void rows_portable(const Job& j, int64_t r0, int64_t r1) { run_tiles<PortableTile>(j, r0, r1); }

void decode_row_portable(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out) {
  for (int64_t c = col0; c < col0 + n;) {
    const int64_t group_end = (c / kChunk + 1) * kChunk;
    const int len = int(std::min(group_end, col0 + n) - c);
    decode_unscaled(W, row, c, len, out + (c - col0));
    if (W.is_mxfp4()) {
      const uint32_t bits = e8m0_bits(W.scale[row * (W.in / 32) + c / 32]);
      float s;
      std::memcpy(&s, &bits, 4);
      for (int k = 0; k < len; ++k) out[c - col0 + k] *= s;
    }
    c += len;
  }
}

}  // namespace linear_detail

using namespace linear_detail;

namespace {
constexpr int64_t kChunkTiles = 64;  // row tiles per chunk of the dynamic split, at most

bool diag_round_x_bf16() {
  static const bool on = env_switch("K3_LINEAR_X_BF16", false);
  return on;
}
}  // namespace

void linear_cpu(const LinearWeight& W, const LinearParams& p, ThreadPool* pool) {
  K3_ASSERT(!W.is_mxfp4() || W.in % 32 == 0);
#ifndef NDEBUG
  if (W.is_mxfp4()) K3_ASSERT(mxfp4_find_bad_scale(W.scale, W.out * (W.in / 32)) < 0);
#endif
  Job j;
  j.W = &W;
  j.x = p.x;
  j.ldx = p.ldx ? p.ldx : W.in;
  j.y = p.y;
  j.ldy = p.ldy ? p.ldy : W.out;
  j.n_tok = p.n_tok;
  if (p.n_tok <= 0 || W.out <= 0) return;

  const CpuLevel level = cpu_level();
  void (*rows)(const Job&, int64_t, int64_t) = rows_portable;
  if (level >= CpuLevel::avx512) rows = rows_avx512;
  const bool bf16_dot = W.dtype == DType::bf16 && !W.is_mxfp4() &&
                        (p.x_precision == Precision::bf16 || diag_round_x_bf16());
  if (level >= CpuLevel::avx512_bf16 && bf16_dot) {
    // x is bf16-rounded, so the bf16 copy is exact (under K3_LINEAR_X_BF16 this copy is the rounding).
    // Padded to 32 columns with zeros.
    thread_local std::vector<uint16_t> scratch;
    j.ldxb = (W.in + 31) / 32 * 32;
    if (scratch.size() < size_t(p.n_tok * j.ldxb)) scratch.resize(size_t(p.n_tok * j.ldxb));
    j.xb = scratch.data();
    // (lambdas capture one pointer so std::function keeps them inline: no allocation per call)
    const Job* jp = &j;
    parallel_for(jp->n_tok > 16 ? pool : nullptr, p.n_tok, [jp](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* x = jp->x + t * jp->ldx;
        uint16_t* d = const_cast<uint16_t*>(jp->xb) + t * jp->ldxb;
        for (int64_t i = 0; i < jp->W->in; ++i) d[i] = f32_to_bf16(x[i]);
        for (int64_t i = jp->W->in; i < jp->ldxb; ++i) d[i] = 0;
      }
    });
    rows = rows_avx512_bf16;
  }
  // Dynamic split: each thread takes chunks of row tiles from a shared counter until none are left, so a
  // thread the OS holds back (a shared machine, a slower core) leaves its rows to the others instead of
  // holding up the call. About 8 chunks per thread, at most kChunkTiles tiles (256 rows) each.
  const int64_t n_tiles = (W.out + kRowTile - 1) / kRowTile;
  const int64_t n_thr = pool ? pool->size() : 1;
  std::atomic<int64_t> next{0};
  struct Split {
    const Job* j;
    void (*rows)(const Job&, int64_t, int64_t);
    int64_t n_tiles, chunk;
    std::atomic<int64_t>* next;
  } split{&j, rows, n_tiles, std::clamp<int64_t>(n_tiles / (8 * n_thr), 1, kChunkTiles), &next};
  const Split* sp = &split;
  parallel_for(n_tiles > 1 ? pool : nullptr, std::min(n_thr, n_tiles), [sp](int64_t, int64_t) {
    for (;;) {
      const int64_t b = sp->next->fetch_add(sp->chunk, std::memory_order_relaxed);
      if (b >= sp->n_tiles) break;
      const int64_t e = std::min(sp->n_tiles, b + sp->chunk);
      sp->rows(*sp->j, b * kRowTile, std::min(sp->j->W->out, e * kRowTile));
    }
  });
  if (p.round_bf16)
    for (int64_t t = 0; t < p.n_tok; ++t)
      for (int64_t o = 0; o < W.out; ++o) j.y[t * j.ldy + o] = round_bf16(j.y[t * j.ldy + o]);
}

void linear_cpu(const LinearWeight& W, const float* x, float* y, int64_t n_tok, ThreadPool* pool) {
  LinearParams p;
  p.n_tok = n_tok;
  p.x = x;
  p.y = y;
  linear_cpu(W, p, pool);
}

void linear_decode_row(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out) {
  if (cpu_level() >= CpuLevel::avx512 && col0 % 16 == 0) decode_row_avx512(W, row, col0, n, out);
  else decode_row_portable(W, row, col0, n, out);
}

}  // namespace k3
