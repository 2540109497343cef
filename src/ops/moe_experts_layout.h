// moe_experts_layout.h: the index and bit rules of the routed-expert kernels (moe_experts_cuda.cu), as
// __host__ __device__ functions so the CPU backend (moe_experts_cpu.cpp) runs the very same rules and the op
// harness can check them against the plain reference without a GPU.
//
// A chunk is 128 columns of the reduction (k) dimension, split in 4 groups of 32 (one E8M0 scale each):
//   weights: lane q (= lane % 4) of a row holds group q as 16 raw bytes (4 words); for k16 step s (0..7) its
//            A registers are the bf16 pairs of bytes 2s (a0 / a1) and 2s + 1 (a2 / a3), i.e. columns
//            q * 32 + 4s + {0, 1} and q * 32 + 4s + {2, 3}: the k order inside the chunk is permuted, which a
//            dot product does not see as long as the activations use the same permutation;
//   activations: 16 units of 8 columns; unit u = q * 4 + sp (columns q * 32 + 8 sp ..) is staged in slot
//            moe_x_slot(u) = sp * 4 + q; lane q reads slot moe_b_slot(sp, q) for the step pair (2 sp, 2 sp + 1):
//            words 0, 1 are b0, b1 of step 2 sp and words 2, 3 those of step 2 sp + 1.
//   Rows of one expert are tiles of BT sorted rows; tile_start[e] is the first tile of expert e.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define K3_HD __host__ __device__ __forceinline__
#else
#define K3_HD inline
#endif

namespace k3::moe {

constexpr int kChunk = 128;  // k columns per chunk: 4 lanes x 32

K3_HD int x_slot(int u) { return (u & 3) * 4 + (u >> 2); }
K3_HD int b_slot(int sp, int q) { return sp * 4 + q; }

// raw byte feeding A register pair `hi` (0: a0 / a1, 1: a2 / a3) at k16 step s, from a lane's 4 raw words
K3_HD uint32_t a_byte(const uint32_t* raw, int s, int hi) { return (raw[s >> 1] >> ((s & 1) * 16 + hi * 8)) & 0xffu; }

// {0, .5, 1, 1.5, 2, 3, 4, 6}[em] as bf16 bits (exact)
K3_HD uint32_t e2m1_mag_bf16(uint32_t em) {
  return em >= 2 ? ((((em >> 1) + 126u) << 7) | ((em & 1u) << 6)) : em ? 0x3f00u : 0u;
}
// byte of two e2m1 (low nibble first) -> bf16x2 bits (low half = low nibble)
K3_HD uint32_t e2m1x2_bf16x2(uint32_t b) {
  const uint32_t lo = e2m1_mag_bf16(b & 7) | ((b & 8u) << 12), hi = e2m1_mag_bf16((b >> 4) & 7) | ((b & 128u) << 8);
  return lo | (hi << 16);
}
// E8M0 scale 2^(e - 127) as bf16 bits in both halves (e = 0: the subnormal 2^-127; e = 255 is rejected at load)
K3_HD uint32_t e8m0_bf16x2(uint32_t e) {
  const uint32_t h = e ? e << 7 : 0x0040u;
  return h | (h << 16);
}

// the expert of a tile: the last e with tile_start[e] <= tile (tile < tile_start[E])
K3_HD int tile_expert(const int* tile_start, int E, int tile) {
  int lo = 0, hi = E;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// tiles of at most BT rows of each expert for `decode` (n_tok <= kMoeDecodeMaxTok) and prefill
constexpr int kDecodeTile = 8, kPrefillTile = 64;

// ---- the decode kernel's rules (experts_decode_kernel; the prefill kernel keeps the rules above) ----
// No table: a nibble pair becomes bf16 bits by shifts and masks. Nibble pair j (0..3) of a 32-bit weight word
// w is nibbles 3 - j (low half) and 7 - j (high half), i.e. columns 3 - j and 7 - j of the word's 8 columns:
// its sign bit lands on the bf16 sign and its 3 magnitude bits on the lowest 2 exponent bits and the top
// mantissa bit, which encodes 2^-126 times the e2m1 value (E = 0 as the bf16 subnormal m * 2^-127).
// Each half is one multiply of the masked nibble by 2^a + 2^b: one copy lands the sign on bit 15 (31), the
// other the magnitude on bits 6..8 (22..24), and the two copies never overlap (no carries); pairs 0 and 1
// shift right by 6 first (shared). Three operations a pair (four as shifts and masks): bit-identical to
// ((w << 4 j) & 0x80008000) | (((w << 4 j) >> 6) & 0x01C001C0), checked over all words (test_moe_layout).
K3_HD uint32_t e2m1_pair(uint32_t w, int j) {
  const uint32_t mask = j == 0 ? 0x03C003C0u : j == 1 ? 0x003C003Cu : j == 2 ? 0x00F000F0u : 0x000F000Fu;
  const uint32_t mul = j == 0 ? 65u : j == 1 ? 1040u : j == 2 ? 260u : 4160u;
  return (((j < 2 ? w >> 6 : w) & mask) * mul) & 0x81C081C0u;
}
// the factor that turns e2m1_pair values into weights: 2^126 * 2^(e - 127) = 2^(e - 1), as bf16x2 bits, for
// e <= kPairScaleMax; larger e multiply by 2^126 (kPairUnit) and then by e8m0_bf16x2(e)
constexpr uint32_t kPairScaleMax = 128, kPairUnit = 0x7E807E80u;
K3_HD uint32_t e8m0_pair_scale(uint32_t e) {
  const uint32_t h = (e + 126u) << 7;
  return h | (h << 16);
}
// Activations (z, and the hidden h between the two GEMMs) are stored with every 8-column unit in the order
// {3, 7, 2, 6, 1, 5, 0, 4}: word j of a stored unit is then the bf16 pair of columns (3 - j, 7 - j), the B
// register that meets weight pair j. unit_pos(c) = where column c (0..7) of a unit is stored.
K3_HD int unit_pos(int c) {
  return (0x13570246 >> (4 * c)) & 7;
}

// ---- the warpgroup-MMA prefill kernel's rules (moe_experts_wgmma_cuda.cu) ----
// The weights stay the A operand, now in registers of a wgmma m64nNk16 (same per-warp fragment as mma.sync
// m16n8k16), decoded by the decode kernel's rules: k16 step s of a chunk is word s / 2 of lane q's group and
// nibble pairs 2 (s % 2) (register k 2q, 2q + 1) and 2 (s % 2) + 1 (k 2q + 8, 2q + 9). The activations are
// the B operand in shared memory, where the MMA reads k in order, so they are stored (z and h alike) with
// every 128-column chunk permuted: column c of a chunk sits at position wg_pos(c), the MMA's k index
// s * 16 + kk. Then a chunk is 256 contiguous bytes per token, staged by plain 16-byte copies.
K3_HD int wg_pos(int c) {  // c = q * 32 + 8 wi + cw  ->  s * 16 + hi * 8 + 2 q + b
  const int q = c >> 5, wi = (c >> 3) & 3, cw = c & 7;
  const int t = 3 - (cw & 3), b = cw >> 2;  // nibble pair j = 2 h + hi holds columns (3 - j, 7 - j)
  return (2 * wi + (t >> 1)) * 16 + (t & 1) * 8 + 2 * q + b;
}
K3_HD bool wg_ok(int d_in, int d_ff) { return d_in % 128 == 0 && d_ff % 128 == 0; }
// a tile holds at most kWgTile rows; an expert's rows are split evenly over its ceil(rows / kWgTile) tiles
constexpr int kWgTile = 128;
K3_HD void wg_tile_rows(const int* offsets, const int* tile_start, int e, int tile, int& r0, int& n_r) {
  const int nt = tile_start[e + 1] - tile_start[e], i = tile - tile_start[e];
  const int cnt = offsets[e + 1] - offsets[e];
  r0 = offsets[e] + int(int64_t(i) * cnt / nt);
  n_r = offsets[e] + int(int64_t(i + 1) * cnt / nt) - r0;
}

// ---- the table version of the decode kernel (experts_decode_lut_kernel; bench variants 12-14, n_tok <= 2)
// ---- Weights become bf16 pairs through a shared-memory table of byte -> e2m1x2_bf16x2(byte) (unscaled, so
// every entry is a normal bf16: exact), one copy per lane so that 32 random lookups never share a bank: entry
// b of lane l at byte lut_addr = b * 256 + 4 l, one prmt away from a weight word (the byte next to the lane's
// offset). The other 128 bytes of each 256 hold the staged activations (lut_x_off). The E8M0 scale is not
// applied per pair: each MMA's 8 token columns are (group of the lane's 32 columns, token) pairs, n = 2 q +
// t, so column n only sums the k of group q = n / 2: lane (g, q) feeds B = x of token g % 2 where g / 2 == q
// and zeros elsewhere, and its accumulators c0 / c2 (token 0) and c1 / c3 (token 1) of rows g / g + 8 are the
// chunk's group-q partial sums, which it scales by 2^(e - 127) in fp32 (exact) into its running sums.
constexpr int kLutTok = 2;              // token columns per tile (a tile of the table version has <= 2 rows)
constexpr int kLutBytes = 256 * 256;    // the table and, in its gaps, the activations
constexpr int kLutMaxK = 128 * 2 * 32;  // a token's gaps: 128 of 2 groups of 32 columns (K <= 8192)

K3_HD uint32_t lut_addr(uint32_t w, int k, uint32_t lane) {  // byte k (0..3) of weight word w, lane 0..31
#if defined(__CUDA_ARCH__)
  return __byte_perm(w, lane << 2, 0x5504u | (uint32_t(k) << 4));
#else
  return (((w >> (8 * k)) & 0xffu) << 8) | (lane << 2);
#endif
}
// where group G (32 columns, 64 bytes) of token t's activations is staged: the gap of entry t * 128 + G / 2
K3_HD uint32_t lut_x_off(int t, int G) {
  return uint32_t(t * 128 + (G >> 1)) * 256u + 128u + uint32_t(G & 1) * 64u;
}
// E8M0 e as fp32 bits: 2^(e - 127); e = 0 is the subnormal 2^-127 (0x00400000 > 0 << 23)
K3_HD uint32_t e8m0_f32_bits(uint32_t e) {
  const uint32_t b = e << 23;
  return b > 0x00400000u ? b : 0x00400000u;
}

// ---- the half-precision decode kernel's rules (experts_decode_f16_kernel, moe_experts_f16_cuda.cu) ----
// Weights: a 32-bit word of 8 e2m1 nibbles (column c at bits 4c .. 4c + 3) becomes two words of 4 e4m3
// bytes by shifts and masks: the nibble's sign goes to bit 7, its 3 magnitude bits to bits 4..2 (exponent
// field e, top mantissa bit m), which is the e2m1 value times 2^-6 exactly (e = 0: the e4m3 subnormal
// m * 2^-7). f8_even: byte j = column 2j; f8_odd: byte j = column 2j + 1. Each 16-bit half then becomes an
// f16 pair in one conversion (exact): half h of f8_even = columns (4h, 4h + 2), of f8_odd (4h + 1, 4h + 3).
K3_HD uint32_t f8_even(uint32_t w) {
  return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
}
K3_HD uint32_t f8_odd(uint32_t w) {
  return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}
// Activations: each row's groups of 32 columns as f16 x s, s = 2^(141 - E) with E the group's largest bf16
// exponent field (at least 15), so the largest |x s| is in [2^14, 2^15) and every value down to 2^28 below
// it converts exactly (a bf16 has 8 significant bits, an f16 11); the group's factor f = 2^6 / s
// (undoing the weights' 2^-6 too). Each 8-column unit is stored as the f16 pairs (0, 2), (1, 3), (4, 6), (5,
// 7): the B registers of the unit's two MMAs.
K3_HD int f16_pos(int c) {  // column c (0..31) of a group -> its f16 slot
  return (c & ~7) | (c & 4) | ((c & 1) << 1) | ((c >> 1) & 1);
}

}  // namespace k3::moe
