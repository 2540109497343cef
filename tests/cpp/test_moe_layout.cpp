// test_moe_layout.cpp: the index and bit rules of the routed-expert kernels (ops/moe_experts_layout.h) that
// the op harness cannot reach one by one: the multiply form of the nibble-pair decode against its shift and
// mask definition, and the wgmma prefill kernel's activation order against the pairs its A registers hold.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_experts_layout.h"

namespace k3 {
namespace {

uint32_t pair_by_shifts(uint32_t w, int j) {  // the definition: nibbles 3 - j and 7 - j onto the bf16 halves
  w <<= 4 * j;
  return (w & 0x80008000u) | ((w >> 6) & 0x01C001C0u);
}

// pos is a permutation of 0 .. n - 1
template <class Pos>
void expect_permutation(Pos pos, int n) {
  std::vector<int> seen(size_t(n), 0);
  for (int c = 0; c < n; ++c) ++seen[size_t(pos(c))];
  for (int p = 0; p < n; ++p) EXPECT_EQ(seen[size_t(p)], 1) << "slot " << p;
}

TEST(MoeLayout, F8BytesAreTheNibblesTimes2PowMinus6) {
  // every byte value in every position of a word: f8_even byte j = column 2j (low nibble of byte j),
  // f8_odd byte j = column 2j + 1 (high nibble), both e4m3 = e2m1 * 2^-6 exactly; the other bytes' bits vary
  int64_t bad = 0;
  for (uint32_t b = 0; b < 256; ++b)
    for (int j = 0; j < 4; ++j)
      for (uint32_t rest : {0u, 0xFFFFFFFFu, 0x5A5A5A5Au, 0xA5A5A5A5u}) {
        const uint32_t w = (rest & ~(0xFFu << (8 * j))) | (b << (8 * j));
        const uint32_t ev = (moe::f8_even(w) >> (8 * j)) & 0xFFu, od = (moe::f8_odd(w) >> (8 * j)) & 0xFFu;
        bad += f8_e4m3_to_f32(uint8_t(ev)) != e2m1_to_f32(uint8_t(b & 15u)) * (1.0f / 64.0f);
        bad += f8_e4m3_to_f32(uint8_t(od)) != e2m1_to_f32(uint8_t(b >> 4)) * (1.0f / 64.0f);
      }
  EXPECT_EQ(bad, 0);
}

TEST(MoeLayout, F16ImageOrderMeetsTheMmaPairs) {
  // f16_pos is a permutation of a group's 32 columns; unit u holds the pairs (0, 2), (1, 3), (4, 6), (5, 7):
  // MMA h of word u takes (4h, 4h + 2) as b0 (the f16 pair of f8_even's half h) and (4h + 1, 4h + 3) as b1
  expect_permutation(moe::f16_pos, 32);
  for (int u = 0; u < 4; ++u)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) {
        EXPECT_EQ(moe::f16_pos(8 * u + 4 * h + 2 * e), 8 * u + 4 * h + e);          // b0: (4h, 4h + 2)
        EXPECT_EQ(moe::f16_pos(8 * u + 4 * h + 2 * e + 1), 8 * u + 4 * h + 2 + e);  // b1: (4h + 1, 4h + 3)
      }
}

TEST(MoeLayout, PairMultiplyMatchesShifts) {
  // each half of a pair depends on one byte of w; every value of the two bytes j reads, others varied
  int64_t bad = 0;
  for (uint32_t lo = 0; lo < 65536; ++lo)
    for (uint32_t hi : {0u, 0xFFFFu, 0x5A5Au, 0xA5A5u, lo, lo ^ 0xFFFFu}) {
      const uint32_t w = lo | (hi << 16), v = (lo << 16) | hi;
      for (int j = 0; j < 4; ++j) {
        bad += moe::e2m1_pair(w, j) != pair_by_shifts(w, j);
        bad += moe::e2m1_pair(v, j) != pair_by_shifts(v, j);
      }
    }
  uint32_t x = 12345;
  for (int i = 0; i < (1 << 22); ++i) {  // and pseudo-random words
    x = x * 1664525u + 1013904223u;
    for (int j = 0; j < 4; ++j) bad += moe::e2m1_pair(x, j) != pair_by_shifts(x, j);
  }
  EXPECT_EQ(bad, 0);
}

TEST(MoeLayout, WgOrderMeetsThePairs) {
  // wg_pos is a permutation of a chunk's 128 columns
  expect_permutation(moe::wg_pos, 128);
  // lane q, k16 step s = 2 wi + h: register 0 (k 2q, 2q + 1) holds nibble pair 2h of word wi (columns
  // 3 - 2h, 7 - 2h of the word), register 2 (k 2q + 8, 2q + 9) pair 2h + 1 (columns 2 - 2h, 6 - 2h)
  for (int q = 0; q < 4; ++q)
    for (int s = 0; s < 8; ++s) {
      const int wi = s / 2, h = s % 2, base = q * 32 + 8 * wi;
      for (int hi = 0; hi < 2; ++hi) {
        const int j = 2 * h + hi;
        EXPECT_EQ(moe::wg_pos(base + 3 - j), s * 16 + hi * 8 + 2 * q);
        EXPECT_EQ(moe::wg_pos(base + 7 - j), s * 16 + hi * 8 + 2 * q + 1);
      }
    }
}

TEST(MoeLayout, WgTilesSplitEvenly) {
  const std::vector<int> offsets = {0, 0, 1, 129, 385, 512}, tile_start = {0, 0, 1, 3, 5, 6};
  for (int e = 0; e < 5; ++e) {
    int next = offsets[size_t(e)];
    for (int t = tile_start[size_t(e)]; t < tile_start[size_t(e) + 1]; ++t) {
      int r0 = 0, n_r = 0;
      moe::wg_tile_rows(offsets.data(), tile_start.data(), e, t, r0, n_r);
      EXPECT_EQ(r0, next);
      EXPECT_LE(n_r, moe::kWgTile);
      EXPECT_GE(n_r, (offsets[size_t(e) + 1] - offsets[size_t(e)]) / (tile_start[size_t(e) + 1] - tile_start[size_t(e)]));
      next = r0 + n_r;
    }
    EXPECT_EQ(next, offsets[size_t(e) + 1]);
  }
}

}  // namespace
}  // namespace k3
