// moe_experts_cpu.cpp: the routed MXFP4 experts on the CPU by the CUDA kernels' algorithm (moe_experts.h):
// the same counting sort and BT-row tiles per expert, the same permuted k order inside 128-column chunks,
// the same byte -> bf16x2 table times the E8M0 scale and the same staging slots (mma prefill), the same nibble
// pairs, scale factors and activation unit order (decode), the same pairs against activations in the wgmma
// order with tiles split evenly (wgmma prefill), all through the rules of moe_experts_layout.h;
// each k16 step adds its 16 products to the fp32 accumulator as one MMA does. So the op harness checks the
// kernels' index and bit rules against moe_experts_ref without a GPU. Single-threaded and slow: a checking
// backend, not the model's CPU path (model/moe.cpp runs the experts through ffn).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_experts.h"
#include "ops/moe_experts_layout.h"

namespace k3 {

namespace {

float bf16_lo(uint32_t w) { return bf16_to_f32(uint16_t(w & 0xffff)); }
float bf16_hi(uint32_t w) { return bf16_to_f32(uint16_t(w >> 16)); }
uint32_t bf16x2_mul(uint32_t a, uint32_t b) {  // exact here: one factor is a power of two
  return uint32_t(f32_to_bf16(bf16_lo(a) * bf16_lo(b))) | (uint32_t(f32_to_bf16(bf16_hi(a) * bf16_hi(b))) << 16);
}

// lane q's load of chunk c0 of row n (MXFP4 [n_out, K]): the 16 raw bytes of its group, the E8M0 exponent
// (zeros and 127 past K)
void load_chunk(const uint8_t* w, const uint8_t* s, int K, int n, int c0, uint32_t (&raw)[4][4],
                uint32_t (&ex)[4]) {
  for (int q = 0; q < 4; ++q) {
    const int col = c0 + q * 32;
    const bool ok = col < K;
    if (ok)
      std::memcpy(raw[q], w + size_t(n) * (K / 2) + col / 2, 16);
    else
      std::memset(raw[q], 0, 16);
    ex[q] = ok ? s[size_t(n) * (K / 32) + col / 32] : 127;
  }
}

// acc[r] = sum over chunks and k16 steps of row `n` of W (MXFP4 [n_out, K]) times X rows xr[r] (bf16 [K])
void row_dot(const uint8_t* w, const uint8_t* s, int K, int n, const std::vector<const uint16_t*>& xr, float* acc) {
  uint32_t slots[16][4];  // one token row's staged chunk: 16 slots of 8 bf16
  for (size_t r = 0; r < xr.size(); ++r) acc[r] = 0.f;
  for (int c0 = 0; c0 < K; c0 += moe::kChunk) {
    uint32_t raw[4][4], scale[4];
    load_chunk(w, s, K, n, c0, raw, scale);
    for (uint32_t& e : scale) e = moe::e8m0_bf16x2(e);
    for (size_t r = 0; r < xr.size(); ++r) {
      for (int u = 0; u < 16; ++u) {
        const int col = c0 + u * 8;
        uint32_t* slot = slots[moe::x_slot(u)];
        if (col < K) std::memcpy(slot, xr[r] + col, 16);
        else std::memset(slot, 0, 16);
      }
      for (int st = 0; st < 8; ++st) {
        float part = 0.f;
        for (int q = 0; q < 4; ++q) {
          const uint32_t* xv = slots[moe::b_slot(st >> 1, q)];
          const uint32_t b0 = xv[2 * (st & 1)], b1 = xv[2 * (st & 1) + 1];
          const uint32_t a0 = bf16x2_mul(moe::e2m1x2_bf16x2(moe::a_byte(raw[q], st, 0)), scale[q]);
          const uint32_t a2 = bf16x2_mul(moe::e2m1x2_bf16x2(moe::a_byte(raw[q], st, 1)), scale[q]);
          part += bf16_lo(a0) * bf16_lo(b0) + bf16_hi(a0) * bf16_hi(b0) + bf16_lo(a2) * bf16_lo(b1) +
                  bf16_hi(a2) * bf16_hi(b1);
        }
        acc[r] += part;
      }
    }
  }
}

// a weight pair of the decode kernel: nibble pair j of word w times 2^(e - 1) (two multiplies for large e)
uint32_t pair_weight(uint32_t w, int j, uint32_t e) {
  const uint32_t v = moe::e2m1_pair(w, j);
  if (e <= moe::kPairScaleMax) return bf16x2_mul(v, moe::e8m0_pair_scale(e));
  return bf16x2_mul(bf16x2_mul(v, moe::kPairUnit), moe::e8m0_bf16x2(e));
}

// row_dot by the nibble-pair kernels' rules (no table): step st of lane q reads word st / 2 of its group and
// nibble pairs 2 (st % 2) (a0) and 2 (st % 2) + 1 (a2); bx(x, c0, st, q, b0, b1) gives the B registers they
// meet in token row x, which depend on how the activations are stored.
template <class Bx>
void row_dot_pairs(const uint8_t* w, const uint8_t* s, int K, int n, const std::vector<const uint16_t*>& xr,
                   float* acc, Bx bx) {
  for (size_t r = 0; r < xr.size(); ++r) acc[r] = 0.f;
  for (int c0 = 0; c0 < K; c0 += moe::kChunk) {
    uint32_t raw[4][4], ex[4];
    load_chunk(w, s, K, n, c0, raw, ex);
    for (size_t r = 0; r < xr.size(); ++r)
      for (int st = 0; st < 8; ++st) {
        const int wi = st >> 1, h = st & 1;
        float part = 0.f;
        for (int q = 0; q < 4; ++q) {
          uint32_t b0, b1;
          bx(xr[r], c0, st, q, b0, b1);
          const uint32_t a0 = pair_weight(raw[q][wi], 2 * h, ex[q]),
                         a2 = pair_weight(raw[q][wi], 2 * h + 1, ex[q]);
          part += bf16_lo(a0) * bf16_lo(b0) + bf16_hi(a0) * bf16_hi(b0) + bf16_lo(a2) * bf16_lo(b1) +
                  bf16_hi(a2) * bf16_hi(b1);
        }
        acc[r] += part;
      }
  }
}

// the decode kernel: X rows stored in unit order, words 2 (st % 2) and 2 (st % 2) + 1 of the 8 columns
// q * 32 + 8 (st / 2) .. (zeros past K)
void row_dot_decode(const uint8_t* w, const uint8_t* s, int K, int n, const std::vector<const uint16_t*>& xr,
                    float* acc) {
  row_dot_pairs(w, s, K, n, xr, acc, [K](const uint16_t* x, int c0, int st, int q, uint32_t& b0, uint32_t& b1) {
    const int col = c0 + q * 32 + (st >> 1) * 8;
    uint32_t xv[4] = {0, 0, 0, 0};
    if (col < K) std::memcpy(xv, x + col, 16);
    b0 = xv[2 * (st & 1)], b1 = xv[2 * (st & 1) + 1];
  });
}

// the wgmma prefill kernel: X rows stored with each 128-column chunk in wg order (moe::wg_pos), so step st of
// lane q meets the MMA's k positions st * 16 + 2q (b0) and st * 16 + 8 + 2q (b1)
void row_dot_wg(const uint8_t* w, const uint8_t* s, int K, int n, const std::vector<const uint16_t*>& xr,
                float* acc) {
  row_dot_pairs(w, s, K, n, xr, acc, [](const uint16_t* x, int c0, int st, int q, uint32_t& b0, uint32_t& b1) {
    std::memcpy(&b0, x + c0 + st * 16 + 2 * q, 4);
    std::memcpy(&b1, x + c0 + st * 16 + 8 + 2 * q, 4);
  });
}

float act(const MoeExpertsParams& p, float g, float u) {
  if (p.act == MoeAct::silu) return g / (1.0f + std::exp(-g)) * u;
  const float a = p.beta1 * std::tanh(g / p.beta1) * (1.0f / (1.0f + std::exp(-g)));
  return a * (p.beta2 > 0 ? p.beta2 * std::tanh(u / p.beta2) : u);
}

}  // namespace

void moe_experts_cpu(const MoeExpertsParams& p) {
  K3_ASSERT(moe_experts_check(p).ok());
  const int64_t n_rows = p.n_tok * p.k, ldz = p.ldz ? p.ldz : p.d_in, ldy = p.ldy ? p.ldy : p.d_in;
  const int E = p.n_expert;
  const bool decode = p.path == MoePath::decode || (p.path == MoePath::automatic && p.n_tok <= kMoeDecodeMaxTok);
  const bool wg = !decode && p.path != MoePath::prefill_mma && moe::wg_ok(p.d_in, p.d_ff);
  const int BT = decode ? moe::kDecodeTile : wg ? moe::kWgTile : moe::kPrefillTile;
  // decode: activations (z, h) stored with every 8-column unit in the decode kernel's order; wg: every
  // 128-column chunk in the wgmma kernel's order
  auto at = [&](int i) {
    return decode ? (i & ~7) | moe::unit_pos(i & 7) : wg ? (i & ~127) | moe::wg_pos(i & 127) : i;
  };
  std::vector<uint16_t> zb(size_t(p.n_tok * p.d_in));
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int i = 0; i < p.d_in; ++i) zb[size_t(t * p.d_in + at(i))] = f32_to_bf16(p.z[t * ldz + i]);
  const auto dot = decode ? row_dot_decode : wg ? row_dot_wg : row_dot;
  // counting sort by expert, tiles of BT rows (the sort kernel's outputs; rows of an expert in row order)
  std::vector<int> cnt(size_t(E), 0), offsets(size_t(E) + 1, 0), tile_start(size_t(E) + 1, 0), order(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    const int e = p.sel[r];
    ++cnt[size_t(e >= 0 && e < E ? e : 0)];
  }
  for (int e = 0; e < E; ++e) {
    offsets[size_t(e) + 1] = offsets[size_t(e)] + cnt[size_t(e)];
    tile_start[size_t(e) + 1] = tile_start[size_t(e)] + (cnt[size_t(e)] + BT - 1) / BT;
  }
  std::vector<int> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int e = p.sel[r];
    order[size_t(fill[size_t(e >= 0 && e < E ? e : 0)]++)] = int(r);
  }
  std::vector<uint16_t> h(size_t(n_rows * p.d_ff)), o(size_t(n_rows * p.d_in));
  std::vector<float> ag(static_cast<size_t>(BT)), au(static_cast<size_t>(BT));
  for (int pass = 0; pass < 2; ++pass) {  // 0: gate/up + act -> h (sorted rows); 1: down -> o (rows t * k + j)
    const int K = pass == 0 ? p.d_in : p.d_ff, n_out = pass == 0 ? p.d_ff : p.d_in;
    for (int tile = 0; tile < tile_start[size_t(E)]; ++tile) {
      const int e = moe::tile_expert(tile_start.data(), E, tile);
      int r0 = offsets[size_t(e)] + (tile - tile_start[size_t(e)]) * BT;
      int n_r = std::min(BT, offsets[size_t(e) + 1] - r0);
      if (wg) moe::wg_tile_rows(offsets.data(), tile_start.data(), e, tile, r0, n_r);
      std::vector<const uint16_t*> xr(static_cast<size_t>(n_r));
      for (int i = 0; i < n_r; ++i)
        xr[size_t(i)] = pass == 0 ? &zb[size_t(order[size_t(r0 + i)] / p.k) * p.d_in] : &h[size_t(r0 + i) * p.d_ff];
      const MoeExpertPtrs& ex = p.experts[e];
      for (int n = 0; n < n_out; ++n) {
        if (pass == 0) {
          dot(ex.w1, ex.s1, K, n, xr, ag.data());
          dot(ex.w3, ex.s3, K, n, xr, au.data());
          for (int i = 0; i < n_r; ++i)
            h[size_t(r0 + i) * p.d_ff + at(n)] =
                f32_to_bf16(act(p, round_bf16(ag[size_t(i)]), round_bf16(au[size_t(i)])));
        } else {
          dot(ex.w2, ex.s2, K, n, xr, ag.data());
          for (int i = 0; i < n_r; ++i) o[size_t(order[size_t(r0 + i)]) * p.d_in + n] = f32_to_bf16(ag[size_t(i)]);
        }
      }
    }
  }
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int i = 0; i < p.d_in; ++i) {
      float acc = 0.f;
      for (int j = 0; j < p.k; ++j) acc += p.wt[t * p.k + j] * bf16_to_f32(o[size_t((t * p.k + j) * p.d_in + i)]);
      p.y[t * ldy + i] = round_bf16(acc);
    }
}

}  // namespace k3
