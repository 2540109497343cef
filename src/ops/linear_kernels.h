// linear_kernels.h: internal to linear_cpu*.cpp. The work split shared by every ISA's kernels.
//
// A thread computes a chunk of output rows [r0, r1) at a time (linear_cpu hands the chunks out). It walks
// tokens in blocks of kTokBlock (the x block stays in L2), and inside a block it walks row tiles of RB (4,
// or 1 for the tail) and token tiles of TB (1..4): one RB x TB micro-kernel reads each weight element once
// per TB tokens and each x element once per RB rows. For n_tok = 1 this is a GEMV that streams every weight
// row once.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/linear.h"

namespace k3::linear_detail {

constexpr int kRowTile = 4;
constexpr int64_t kTokBlock = 64;

struct Job {
  const LinearWeight* W = nullptr;
  const float* x = nullptr;  // [n_tok, in], row stride ldx
  int64_t ldx = 0;
  const uint16_t* xb = nullptr;  // bf16 copy of x for the bf16 path: [n_tok, ldxb], zero-padded to 32
  int64_t ldxb = 0;
  float* y = nullptr;  // [n_tok, out], row stride ldy
  int64_t ldy = 0;
  int64_t n_tok = 0;
};

// K<RB, TB>::run(job, r, t) computes y[t .. t+TB, r .. r+RB).
template <template <int, int> class K>
void run_tiles(const Job& j, int64_t r0, int64_t r1) {
  for (int64_t t0 = 0; t0 < j.n_tok; t0 += kTokBlock) {
    const int64_t t1 = std::min(j.n_tok, t0 + kTokBlock);
    for (int64_t r = r0; r < r1;) {
      const bool full = r1 - r >= kRowTile;
      for (int64_t t = t0; t < t1;) {
        const int tb = int(std::min<int64_t>(4, t1 - t));
        switch (tb * 2 + (full ? 1 : 0)) {
          case 2: K<1, 1>::run(j, r, t); break;
          case 3: K<4, 1>::run(j, r, t); break;
          case 4: K<1, 2>::run(j, r, t); break;
          case 5: K<4, 2>::run(j, r, t); break;
          case 6: K<1, 3>::run(j, r, t); break;
          case 7: K<4, 3>::run(j, r, t); break;
          case 8: K<1, 4>::run(j, r, t); break;
          default: K<4, 4>::run(j, r, t); break;
        }
        t += tb;
      }
      r += full ? kRowTile : 1;
    }
  }
}

// Rows [r0, r1) of y for every token. fp32 x (exact); the bf16 variant needs job.xb.
void rows_portable(const Job& j, int64_t r0, int64_t r1);
void rows_avx512(const Job& j, int64_t r0, int64_t r1);
void rows_avx512_bf16(const Job& j, int64_t r0, int64_t r1);
// Decoders for linear_decode_row; the avx512 one needs col0 % 16 == 0.
void decode_row_portable(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out);
void decode_row_avx512(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out);

// E8M0 byte -> 2^(e-127) as fp32 bits (e = 0 is the subnormal 2^-127; e = 255 must not reach here).
inline uint32_t e8m0_bits(uint8_t e) { return e ? uint32_t(e) << 23 : 0x00400000u; }

}  // namespace k3::linear_detail
