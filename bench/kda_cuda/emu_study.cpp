// emu_study.cpp: accuracy of the two-kernel GPU prefill's algorithm without a GPU: its host emulation
// (kda_prefill_split_emulate: fp16 scratch, tf32 MMA operands, fp32 accumulation, bf16 o) against the fp64
// recurrence (kda_prefill_fast_ref) on the bench's input laws (q, k unit rows, q * 128^-1/2, v ~ N(0, 1),
// g = -5 sigmoid(1.5 z - 3.5), beta uniform (0.02, 0.98), S0 ~ 0.05 N(0, 1), all bf16-valued).
//
//   g++ -O2 -std=c++20 -Isrc -Iinclude bench/kda_cuda/emu_study.cpp src/ops/kda_fast_prefill_emu.cpp
//       src/ops/kda_fast_ref.cpp src/core/dtype.cpp -o emu_study && ./emu_study 8192 3   (T, heads)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/kda_fast.h"

using namespace k3;

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 2048, H = argc > 2 ? std::atoi(argv[2]) : 1, D = 128;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.02f, 0.98f);
  const size_t n = size_t(T) * H * D;
  std::vector<uint16_t> q(n), k(n), v(n), g(n), o_emu(n), o_ref(n);
  std::vector<float> beta(size_t(T) * H), S0(size_t(H) * D * D);
  for (size_t r = 0; r < size_t(T) * H; ++r) {
    float a[128], b[128], sa = 0, sb = 0;
    for (int i = 0; i < D; ++i) a[i] = nd(rng), b[i] = nd(rng), sa += a[i] * a[i], sb += b[i] * b[i];
    for (int i = 0; i < D; ++i) {
      q[r * D + i] = f32_to_bf16(a[i] / std::sqrt(sa) / std::sqrt(float(D)));
      k[r * D + i] = f32_to_bf16(b[i] / std::sqrt(sb));
      v[r * D + i] = f32_to_bf16(nd(rng));
      g[r * D + i] = f32_to_bf16(-5.f / (1.f + std::exp(-(1.5f * nd(rng) - 3.5f))));
    }
    beta[r] = bf16_to_f32(f32_to_bf16(ud(rng)));
  }
  for (auto& x : S0) x = 0.05f * nd(rng);
  std::vector<float> S_emu = S0, S_ref = S0;
  int cu[2] = {0, T};
  KdaPrefillParams p;
  p.n_seq = 1, p.n_tok = T, p.n_head = H, p.cu_seqlens = cu;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data();
  p.S = S_ref.data(), p.o = o_ref.data();
  kda_prefill_fast_ref(p);
  p.S = S_emu.data(), p.o = o_emu.data();
  kda_prefill_split_emulate(p, 21);
  double no = 0, do_ = 0, ns = 0, ds = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = bf16_to_f32(o_emu[i]), y = bf16_to_f32(o_ref[i]);
    no += (x - y) * (x - y), do_ += y * y;
  }
  for (size_t i = 0; i < S0.size(); ++i) ns += double(S_emu[i] - S_ref[i]) * (S_emu[i] - S_ref[i]), ds += double(S_ref[i]) * S_ref[i];
  std::printf("T=%d H=%d: two-kernel emulation vs fp64: o rel-RMS %.3g, state rel-RMS %.3g\n", T, H,
              std::sqrt(no / do_), std::sqrt(ns / ds));
  return 0;
}
