// lut_emu.cpp: host emulation of the MoE decode kernel's table version (experts_decode_lut_kernel,
// moe_experts_cuda.cu; rules in ops/moe_experts_layout.h) against the fp64 dot products and against the
// register kernel's decode (e2m1_pair x pair scale in bf16). No GPU: one block's 4 warps x 32 lanes are run
// lane by lane, mma.sync m16n8k16 emulated from its PTX fragment layout (fp64 products summed, rounded to
// fp32).
//   checks: 1. prmt (CUDA __byte_perm semantics) = the host lut_addr, every byte / lane / position;
//           2. table entry x 2^(e - 127) = the register kernel's pair value for every byte and e in [0, 254];
//           3. whole blocks (gate / up and down, 1 and 2 tokens, K with a partial chunk, rows past
//              n_out, e = 0 and e > 128 among the scales): relative error of each output sum vs fp64.
// Build: g++ -std=c++20 -O2 -Isrc bench/moe_cuda/lut_emu.cpp -o /tmp/lut_emu && /tmp/lut_emu
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ops/moe_experts_layout.h"

using namespace k3;

namespace {

float bf16_to_f(uint32_t h) {
  const uint32_t b = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t f_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float bits_to_f(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t f_to_bf16_rn(float f) {  // finite inputs
  const uint32_t b = f_to_bits(f);
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}
// bf16x2 multiply as HMUL2.BF16 (fp32 product of two bf16, rounded to nearest even)
uint32_t bf16x2_mul_h(uint32_t a, uint32_t b) {
  const uint32_t lo = f_to_bf16_rn(bf16_to_f(a) * bf16_to_f(b)),
                 hi = f_to_bf16_rn(bf16_to_f(a >> 16) * bf16_to_f(b >> 16));
  return lo | (hi << 16);
}
// CUDA __byte_perm(x, y, s): byte n of the result = byte (s >> 4 n) & 7 of {y, x}
uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t((v >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
  return r;
}
double e2m1_val(uint32_t n) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (n & 8 ? -1 : 1) * mag[n & 7];
}

int g_fail = 0;

// mma.sync m16n8k16 row.col bf16 -> fp32, C += A B, from the 32 lanes' fragments (fp64 sum, one rounding)
void mma_emu(float (&c)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2]) {
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, q = l & 3;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * q + h] = bf16_to_f(a[l][0] >> (16 * h));
      A[g + 8][2 * q + h] = bf16_to_f(a[l][1] >> (16 * h));
      A[g][2 * q + 8 + h] = bf16_to_f(a[l][2] >> (16 * h));
      A[g + 8][2 * q + 8 + h] = bf16_to_f(a[l][3] >> (16 * h));
      B[2 * q + h][g] = bf16_to_f(b[l][0] >> (16 * h));
      B[2 * q + 8 + h][g] = bf16_to_f(b[l][1] >> (16 * h));
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, q = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int r = g + (i >> 1) * 8, n = 2 * q + (i & 1);
      double s = c[l][i];
      for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][n];
      c[l][i] = float(s);
    }
  }
}

struct Mat {  // one MXFP4 matrix [rows, K]
  int rows = 0, K = 0;
  std::vector<uint8_t> w, s;  // [rows, K/2], [rows, K/32]
  double at(int r, int c) const {
    const uint8_t b = w[size_t(r) * (K / 2) + c / 2];
    return e2m1_val(c & 1 ? b >> 4 : b & 15) * std::ldexp(1.0, int(s[size_t(r) * (K / 32) + c / 32]) - 127);
  }
};

// one block of experts_decode_lut_kernel<DUAL>: returns v[token][neuron slot] as the kernel's warp 0 lanes
// hold them before the epilogue (DUAL: slot 2 o = gate, 2 o + 1 = up of neuron n0 + 8 o + g; down: row
// n0 + 8 o + g)
void run_block(bool dual, const Mat& wA, const Mat& wB, int n0, int n_out, int K, int n_r,
               const std::vector<std::vector<uint16_t>>& x, std::vector<std::vector<double>>& out_sum,
               std::vector<std::vector<double>>& out_ref) {
  std::vector<uint8_t> sm(moe::kLutBytes, 0xcd);  // garbage where nothing is written
  // table fill, as the kernel: thread tid: j = tid & 7, lo = tid >> 3
  for (int tid = 0; tid < 128; ++tid) {
    const int j = tid & 7, lo = tid >> 3;
    const uint32_t flo = moe::e2m1x2_bf16x2(uint32_t(lo)) & 0xffffu;
    for (int hi = 0; hi < 16; ++hi) {
      const uint32_t v = flo | (moe::e2m1x2_bf16x2(uint32_t(hi)) << 16);
      for (int w = 0; w < 4; ++w) std::memcpy(&sm[size_t((hi * 16 + lo) * 256 + j * 16 + w * 4)], &v, 4);
    }
  }
  // activation staging: 16-byte units into the gaps
  const int units = K / 8;
  for (int i = 0; i < n_r * units; ++i) {
    const int t = i >= units, u = i - t * units;
    std::memcpy(&sm[moe::lut_x_off(t, u >> 2) + (u & 3) * 16], &x[size_t(t)][size_t(u) * 8], 16);
  }
  const Mat* wp[4] = {&wA, dual ? &wB : &wA, &wA, dual ? &wB : &wA};
  const int n_chunk = (K + moe::kChunk - 1) / moe::kChunk, per = (n_chunk + 3) / 4;
  float acc[4][32][2][4] = {};  // [warp][lane][A/B][i]
  for (int warp = 0; warp < 4; ++warp) {
    const int c_begin = warp * per, c_end = std::min(n_chunk, c_begin + per);
    for (int c = c_begin; c < c_end; ++c) {
      uint32_t raw[32][4][4];
      uint32_t ex[32][4];
      uint32_t xw[32][16];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, q = lane & 3;
        const int row[4] = {n0 + g, dual ? n0 + g : n0 + 8 + g, dual ? n0 + 8 + g : n0 + 16 + g,
                            dual ? n0 + 8 + g : n0 + 24 + g};
        const int col = c * moe::kChunk + q * 32;
        for (int k = 0; k < 4; ++k) {
          const bool ok = col < K && row[k] < n_out;
          for (int wi = 0; wi < 4; ++wi)
            raw[lane][k][wi] =
                ok ? uint32_t(wp[k]->w[size_t(row[k]) * (K / 2) + col / 2 + 4 * wi]) |
                         uint32_t(wp[k]->w[size_t(row[k]) * (K / 2) + col / 2 + 4 * wi + 1]) << 8 |
                         uint32_t(wp[k]->w[size_t(row[k]) * (K / 2) + col / 2 + 4 * wi + 2]) << 16 |
                         uint32_t(wp[k]->w[size_t(row[k]) * (K / 2) + col / 2 + 4 * wi + 3]) << 24
                   : 0u;
          ex[lane][k] = ok ? wp[k]->s[size_t(row[k]) * (K / 32) + col / 32] : 127u;
        }
        const int tok = g & 1, G = c * 4 + q;
        const bool okx = (g >> 1) == q && tok < n_r && G * 32 < K;
        for (int i = 0; i < 16; ++i) {
          uint32_t v = 0;
          if (okx) std::memcpy(&v, &sm[moe::lut_x_off(tok, G) + i * 4], 4);
          xw[lane][i] = v;
        }
      }
      float ca[32][4] = {}, cb[32][4] = {};
      for (int wi = 0; wi < 4; ++wi)
        for (int h = 0; h < 2; ++h) {
          uint32_t fa[32][4], fb[32][4], bb[32][2];
          for (int lane = 0; lane < 32; ++lane) {
            auto get = [&](uint32_t w, int k) {
              uint32_t v;
              std::memcpy(&v, &sm[moe::lut_addr(w, k, uint32_t(lane))], 4);
              return v;
            };
            const uint32_t wa0 = raw[lane][0][wi], wa1 = raw[lane][1][wi], wb0 = raw[lane][2][wi],
                           wb1 = raw[lane][3][wi];
            const uint32_t a_[4] = {get(wa0, 2 * h), get(wa1, 2 * h), get(wa0, 2 * h + 1),
                                    get(wa1, 2 * h + 1)};
            const uint32_t b_[4] = {get(wb0, 2 * h), get(wb1, 2 * h), get(wb0, 2 * h + 1),
                                    get(wb1, 2 * h + 1)};
            for (int i = 0; i < 4; ++i) fa[lane][i] = a_[i], fb[lane][i] = b_[i];
            bb[lane][0] = xw[lane][4 * wi + 2 * h], bb[lane][1] = xw[lane][4 * wi + 2 * h + 1];
          }
          mma_emu(ca, fa, bb);
          mma_emu(cb, fb, bb);
        }
      for (int lane = 0; lane < 32; ++lane) {
        float sc[4];
        for (int k = 0; k < 4; ++k) sc[k] = bits_to_f(moe::e8m0_f32_bits(ex[lane][k]));
        for (int i = 0; i < 4; ++i) {
          acc[warp][lane][0][i] = std::fma(ca[lane][i], sc[i >> 1], acc[warp][lane][0][i]);
          acc[warp][lane][1][i] = std::fma(cb[lane][i], sc[2 + (i >> 1)], acc[warp][lane][1][i]);
        }
      }
    }
    // quad reduction (xor 1 then xor 2), as __shfl_xor_sync
    for (int m : {1, 2}) {
      float t[32][2][4];
      std::memcpy(t, acc[warp], sizeof(t));
      for (int lane = 0; lane < 32; ++lane)
        for (int o = 0; o < 2; ++o)
          for (int i = 0; i < 4; ++i) acc[warp][lane][o][i] = t[lane][o][i] + t[lane ^ m][o][i];
    }
  }
  // warp 0 adds the others in order; lane (g, q < n_r) holds token q
  out_sum.assign(size_t(n_r), std::vector<double>(size_t(dual ? 16 : 32) * 2, 0.0));
  out_ref = out_sum;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    if (q >= n_r) continue;
    float a[2][4];
    std::memcpy(a, acc[0][lane], sizeof(a));
    for (int w = 1; w < 4; ++w)
      for (int o = 0; o < 2; ++o)
        for (int i = 0; i < 4; ++i) a[o][i] += acc[w][lane][o][i];
    const float v[4] = {a[0][q], a[0][2 + q], a[1][q], a[1][2 + q]};
    for (int o = 0; o < 4; ++o) {
      // DUAL: v[0] gate(n0 + g), v[1] up(n0 + g), v[2] gate(n0 + 8 + g), v[3] up(n0 + 8 + g);
      // down: row n0 + 8 o + g
      const Mat* m = dual ? (o & 1 ? &wB : &wA) : &wA;
      const int r = dual ? n0 + 8 * (o >> 1) + g : n0 + 8 * o + g;
      const int slot = dual ? 2 * (8 * (o >> 1) + g) + (o & 1) : 8 * o + g;
      if (r >= n_out) continue;
      double ref = 0;
      for (int cc = 0; cc < K; ++cc) ref += m->at(r, cc) * bf16_to_f(x[size_t(q)][size_t(cc)]);
      out_sum[size_t(q)][size_t(slot)] = v[o];
      out_ref[size_t(q)][size_t(slot)] = ref;
    }
  }
}

}  // namespace

int main() {
  // 1. prmt vs host formula
  {
    std::mt19937 rng(1);
    int bad = 0;
    for (int it = 0; it < 200000; ++it) {
      const uint32_t w = rng(), lane = rng() % 32;
      const int k = int(rng() % 4);
      const uint32_t dev = byte_perm(w, lane << 2, 0x5504u | (uint32_t(k) << 4));
      bad += dev != moe::lut_addr(w, k, lane);
      const uint32_t bank = (dev >> 2) % 32;
      bad += bank != lane;  // conflict-free: lane l always hits bank l
    }
    std::printf("1. prmt address = host lut_addr, bank = lane: %d mismatches %s\n", bad, bad ? "FAIL" : "ok");
    g_fail += bad != 0;
  }
  // 2. table entry x 2^(e-127) vs the register kernel's pair values (as reals), every byte and exponent
  {
    int bad = 0;
    for (uint32_t e = 0; e < 255; ++e) {
      const double sc = std::ldexp(1.0, int(e) - 127);
      // register kernel: word w with nibble pair j; put byte b as nibbles (3 - j) and (7 - j) of a word
      const bool big = e > moe::kPairScaleMax;
      const uint32_t s1 = big ? moe::kPairUnit : moe::e8m0_pair_scale(e),
                     t1 = big ? moe::e8m0_bf16x2(e) : 0x3F803F80u;
      for (uint32_t b = 0; b < 256; ++b) {
        const uint32_t ent = moe::e2m1x2_bf16x2(b);
        for (int h = 0; h < 2; ++h) {
          const double lutv = double(bf16_to_f(ent >> (16 * h))) * sc;
          const double ref = e2m1_val(h ? b >> 4 : b & 15) * sc;
          for (int j = 0; j < 4; ++j) {
            const uint32_t w = ((b & 15u) << (4 * (3 - j))) | ((b >> 4) << (4 * (7 - j)));
            uint32_t pv = bf16x2_mul_h(moe::e2m1_pair(w, j), s1);
            if (big) pv = bf16x2_mul_h(pv, t1);
            const double regv = bf16_to_f(pv >> (16 * h));
            // the register kernel's bf16 multiply flushes nothing here except what bf16 cannot hold; both
            // must equal the exact value wherever bf16 holds it
            const bool rep = ref == 0 || (std::fabs(ref) >= std::ldexp(1.0, -133) && std::fabs(ref) < 3.3e38);
            if (lutv != ref || (rep && regv != ref)) ++bad;
          }
        }
      }
    }
    std::printf(
        "2. table entry x 2^(e-127) = register kernel pair value = exact, 256 bytes x 255 e: %d bad %s\n",
        bad, bad ? "FAIL" : "ok");
    g_fail += bad != 0;
  }
  // 3. blocks
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    struct Case {
      bool dual;
      int K, n_out, n0, n_r, e_lo, e_span;
    } cases[] = {
        {true, 3584, 3072, 16, 1, 118, 6},   {false, 3072, 3584, 64, 1, 118, 6},
        {true, 3584, 3072, 3056, 2, 116, 9}, {false, 3072, 3584, 3552, 2, 116, 9},
        {true, 160, 100, 96, 1, 0, 40},      {false, 96, 200, 192, 2, 120, 130},
        {true, 8192, 40, 32, 2, 100, 40},    {false, 32, 32, 0, 1, 127, 1},
    };
    for (const Case& cs : cases) {
      Mat A, B;
      for (Mat* m : {&A, &B}) {
        m->rows = cs.n_out, m->K = cs.K;
        m->w.resize(size_t(cs.n_out) * cs.K / 2), m->s.resize(size_t(cs.n_out) * cs.K / 32);
        for (auto& v : m->w) v = uint8_t(rng());
        for (auto& v : m->s) v = uint8_t(std::min<uint32_t>(254, cs.e_lo + rng() % uint32_t(cs.e_span)));
      }
      std::vector<std::vector<uint16_t>> x(2, std::vector<uint16_t>(size_t(cs.K)));
      for (auto& r : x)
        for (auto& v : r) v = uint16_t(f_to_bf16_rn(nd(rng)));
      std::vector<std::vector<double>> got, ref;
      run_block(cs.dual, A, B, cs.n0, cs.n_out, cs.K, cs.n_r, x, got, ref);
      double worst = 0, num = 0, den = 0;
      int n = 0;
      for (size_t t = 0; t < got.size(); ++t)
        for (size_t i = 0; i < got[t].size(); ++i) {
          if (ref[t][i] == 0 && got[t][i] == 0) continue;
          const double d = got[t][i] - ref[t][i];
          num += d * d, den += ref[t][i] * ref[t][i], ++n;
          // per-output bound: fp32 accumulation of |terms|, relative to the sum of magnitudes
          worst = std::max(worst, std::fabs(d) / std::max(std::fabs(ref[t][i]), 1e-300));
        }
      const double nmse = den > 0 ? num / den : 0;
      const bool ok = nmse < 1e-10 && n > 0;
      g_fail += !ok;
      std::printf(
          "3. %s K=%d n_out=%d n0=%d tokens=%d e in [%d, %d]: %d outputs, nmse vs fp64 %.3g, worst rel %.3g "
          "%s\n",
          cs.dual ? "gate/up" : "down", cs.K, cs.n_out, cs.n0, cs.n_r, cs.e_lo,
          std::min(254, cs.e_lo + cs.e_span - 1), n, nmse, worst, ok ? "ok" : "FAIL");
    }
  }
  std::printf("%s (%d failed)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
