// test_dsa_ops.cpp: host checks of the DSA ops (ops/dsa_index.h, ops/dsa_topk.h) that need no GPU.
//   - the FP8 index-key encoder: every finite e4m3 code survives decode -> encode, midpoints round to even,
//     large values saturate to 448; the store's scale makes max|k| land on 448
//   - a host emulation of the CUDA radix top-k (same chunking over a cluster of CTAs, the same 4 digit
//     passes, the same output-slot formula) equals the reference top-k on rows with heavy ties, +0/-0, and 1M
//     entries; one of the sample-select kernel (its sample positions, bound and candidate rule) too, and it
//     keeps its bound (the candidate path) on normal and position-rising rows up to 1M
//   - FP8 vs bf16 index keys on the reference path: top-2048 overlap and score NMSE on random and structured
//     keys (printed; the bounds are the values measured with these seeds, with margin)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/dsa_index.h"
#include "ops/dsa_topk.h"

namespace k3 {
namespace {

TEST(DsaFp8, EncoderRoundTripsEveryCodeAndRoundsToEven) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const float v = f8_e4m3_to_f32(uint8_t(c));
    const uint8_t back = dsa_f32_to_e4m3(v);
    if (v == 0.f) {
      EXPECT_EQ(back & 0x7F, 0) << c;
      continue;
    }
    EXPECT_EQ(back, uint8_t(c)) << "code " << c << " value " << v;
  }
  // midpoints between neighbours go to the even code; beyond 448 saturates
  for (int c = 1; c < 0x7E; ++c) {
    const float lo = f8_e4m3_to_f32(uint8_t(c)), hi = f8_e4m3_to_f32(uint8_t(c + 1));
    const float mid = 0.5f * (lo + hi);
    const uint8_t r = dsa_f32_to_e4m3(mid);
    EXPECT_EQ(r, uint8_t((c % 2 == 0) ? c : c + 1)) << "midpoint of " << c;
    EXPECT_EQ(dsa_f32_to_e4m3(-mid), uint8_t(0x80 | r));
  }
  EXPECT_EQ(dsa_f32_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(dsa_f32_to_e4m3(-500.f), 0xFE);
  EXPECT_EQ(f8_e4m3_to_f32(0x7E), 448.f);
}

TEST(DsaFp8, StoreScalesTheLargestEntryTo448) {
  const int Di = 32, P = 4;
  std::vector<int32_t> table = {1, 0};
  std::vector<uint8_t> pages(2 * dsa_key_page_bytes(DsaKeyFormat::fp8, P, Di));
  std::vector<float> k(size_t(6) * Di);
  std::mt19937_64 r(3);
  std::normal_distribution<float> nd;
  for (float& v : k) v = nd(r);
  for (int e = 0; e < Di; ++e) k[size_t(2 * Di + e)] = 0.f;  // an all-zero row: scale 1, codes 0
  DsaKeyStoreParams s;
  s.cache.fmt = DsaKeyFormat::fp8, s.cache.d_head = Di, s.cache.page_size = P, s.cache.max_pages = 2;
  s.cache.n_pages = 2, s.cache.pages = pages.data(), s.cache.block_table = table.data();
  s.n_tok = 6, s.k = k.data(), s.pos0 = 0;
  ASSERT_TRUE(dsa_key_store_check(s).ok());
  dsa_key_store_ref(s);
  for (int t = 0; t < 6; ++t) {
    const uint8_t* page =
        pages.data() + size_t(table[size_t(t / P)]) * dsa_key_page_bytes(DsaKeyFormat::fp8, P, Di);
    float sc;
    std::memcpy(&sc, page + size_t(P) * Di + size_t(t % P) * 4, 4);
    float amax = 0, worst = 0;
    for (int e = 0; e < Di; ++e) amax = std::max(amax, std::fabs(k[size_t(t * Di + e)]));
    for (int e = 0; e < Di; ++e) {
      const float deq = sc * f8_e4m3_to_f32(page[size_t(t % P) * Di + size_t(e)]);
      worst = std::max(worst, std::fabs(deq - k[size_t(t * Di + e)]));
    }
    if (amax == 0.f) {
      EXPECT_EQ(sc, 1.f);
      EXPECT_EQ(worst, 0.f);
    } else {
      EXPECT_EQ(sc, amax / 448.f);
      EXPECT_LE(worst, amax / 448.f * 16.f) << "token " << t;  // half an e4m3 step at the top binade (32 / 2)
    }
  }
}

// ---- host emulation of dsa_topk_cuda's radix select (see dsa_topk_cuda.cu) ----
uint32_t order_key(float f) {
  if (f == 0.f) f = 0.f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

void radix_topk_row(const float* score, int64_t n, int topk, int C, int32_t* out) {
  std::fill(out, out + topk, -1);
  if (n <= topk) {
    std::iota(out, out + n, 0);
    return;
  }
  const int64_t chunk = (n + C - 1) / C;
  // per CTA r: its histogram, and (as the kernel gets them from its merges) the lower ranks' counts of keys
  // above each pass's digit and, in the last pass, at it
  std::vector<uint32_t> gt_lower(size_t(C), 0), eq_lower(size_t(C), 0);
  std::vector<std::vector<uint32_t>> hist(size_t(C), std::vector<uint32_t>(256));
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(topk);
  for (int shift = 24; shift >= 0; shift -= 8) {
    std::vector<uint32_t> merged(256, 0);
    for (int r = 0; r < C; ++r) {
      std::fill(hist[size_t(r)].begin(), hist[size_t(r)].end(), 0u);
      const int64_t lo = std::min(n, r * chunk), hi = std::min(n, lo + chunk);
      for (int64_t i = lo; i < hi; ++i) {
        const uint32_t k = order_key(score[i]);
        if ((k & mask) == prefix) ++hist[size_t(r)][(k >> shift) & 255u];
      }
      for (int b = 0; b < 256; ++b) merged[size_t(b)] += hist[size_t(r)][size_t(b)];
    }
    uint32_t above = 0;
    int d = 255;
    while (above + merged[size_t(d)] < remaining) above += merged[size_t(d--)];
    for (int r = 0; r < C; ++r) {
      std::vector<uint32_t> lower(256, 0);
      for (int q = 0; q < r; ++q)
        for (int b = 0; b < 256; ++b) lower[size_t(b)] += hist[size_t(q)][size_t(b)];
      for (int b = d + 1; b < 256; ++b) gt_lower[size_t(r)] += lower[size_t(b)];
      if (shift == 0) eq_lower[size_t(r)] = lower[size_t(d)];
    }
    remaining -= above;
    prefix |= uint32_t(d) << shift;
    mask |= 255u << shift;
  }
  const uint32_t T = prefix, need = remaining;
  uint32_t gt_all = 0, eq_all = 0;  // running over the row in position order: what each CTA's base must be
  for (int r = 0; r < C; ++r) {
    EXPECT_EQ(gt_lower[size_t(r)], gt_all);
    EXPECT_EQ(eq_lower[size_t(r)], eq_all);
    uint32_t gt = gt_lower[size_t(r)], eq = eq_lower[size_t(r)];  // the kernel's bases, then its block scans
    const int64_t lo = std::min(n, r * chunk), hi = std::min(n, lo + chunk);
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t k = order_key(score[i]);
      if (k > T) {
        out[gt + std::min(eq, need)] = int32_t(i);
        ++gt, ++gt_all;
      } else if (k == T) {
        if (eq < need) out[gt + eq] = int32_t(i);
        ++eq, ++eq_all;
      }
    }
  }
  EXPECT_EQ(gt_all + need, uint32_t(topk));
}

TEST(DsaTopk, RadixEmulationEqualsReferenceWithTies) {
  std::mt19937_64 r(17);
  struct Row {
    int64_t n;
    int law, C;
  };
  const int topk = 2048;
  for (Row row : {Row{2049, 0, 1}, Row{5000, 1, 1}, Row{70001, 2, 5}, Row{131072, 1, 8}, Row{50000, 3, 4},
                  Row{int64_t(1) << 20, 1, 8}, Row{int64_t(1) << 20, 0, 8}, Row{9000, 4, 3},
                  Row{131072, 0, 16}, Row{131072, 1, 16}}) {
    std::vector<float> s(size_t(row.n));
    std::normal_distribution<float> nd;
    for (float& v : s) {
      const uint64_t u = r();
      switch (row.law) {
        case 0:
          v = nd(r);
          break;  // distinct
        case 1:
          v = float(int(u % 4)) - 1.f;
          break;  // 4 levels
        case 2:
          v = u % 3 == 0 ? 0.5f : (u % 2 ? 0.f : -0.f);
          break;  // +0 / -0 ties
        case 3:
          v = 1.25f;
          break;  // one value
        case 4:
          v = u % 5 == 0 ? -std::ldexp(1.f, -130) : -0.f;
          break;  // denormals and zeros below 0
      }
    }
    std::vector<int32_t> got(topk), ref(topk);
    radix_topk_row(s.data(), row.n, topk, row.C, got.data());
    DsaTopkParams p;
    p.n_row = 1, p.topk = topk, p.ld = row.n, p.score = s.data(), p.len0 = row.n, p.max_len = row.n;
    p.sel = ref.data();
    ASSERT_TRUE(dsa_topk_check(p).ok());
    dsa_topk_ref(p);
    EXPECT_EQ(got, ref) << "n=" << row.n << " law=" << row.law << " C=" << row.C;
  }
}

// ---- host emulation of the sample-select kernel (dsa_topk_sample_cuda.cu; its constants) ----
// Returns true where the row took the candidate path (the bound held), false for the whole-row fallback.
bool sample_topk_row(const float* score, int64_t n, int topk, int32_t* out) {
  constexpr int64_t kCand = 8192, kSamples = 4096;
  if (n <= kCand) {
    radix_topk_row(score, n, topk, 1, out);
    return true;
  }
  std::vector<uint32_t> sample(static_cast<size_t>(kSamples));
  for (int64_t s = 0; s < kSamples; ++s)
    sample[size_t(s)] = order_key(score[(2 * s + 1) * n / (2 * kSamples)]);
  const int64_t r = std::max<int64_t>(1, std::min<int64_t>(kSamples, (kSamples * kCand / 2 + n - 1) / n));
  std::nth_element(sample.begin(), sample.begin() + (r - 1), sample.end(), std::greater<>());
  const uint32_t L = sample[size_t(r - 1)] & 0xFFFF0000u;  // two radix passes: its top 16 bits
  std::vector<float> cand;
  std::vector<int32_t> pos;
  for (int64_t j = 0; j < n; ++j)
    if (order_key(score[j]) >= L) cand.push_back(score[j]), pos.push_back(int32_t(j));
  if (int64_t(cand.size()) < topk || int64_t(cand.size()) > kCand) {
    radix_topk_row(score, n, topk, 1, out);
    return false;
  }
  radix_topk_row(cand.data(), int64_t(cand.size()), topk, 1, out);
  for (int i = 0; i < topk; ++i) out[i] = pos[size_t(out[i])];
  return true;
}

TEST(DsaTopk, SampleEmulationEqualsReferenceAndKeepsItsBound) {
  std::mt19937_64 r(23);
  const int topk = 2048;
  struct Row {
    int64_t n;
    int law;          // 0 normal, 1 four levels, 2 rising with the position (recency), 3 one value
    bool candidates;  // the path the kernel must take
  };
  for (Row row :
       {Row{5000, 0, true}, Row{8193, 0, true}, Row{9000, 0, true}, Row{70001, 0, true}, Row{131072, 0, true},
        Row{int64_t(1) << 20, 0, true}, Row{131072, 2, true}, Row{40000, 1, false}, Row{50000, 3, false}}) {
    std::vector<float> s(size_t(row.n));
    std::normal_distribution<float> nd;
    for (size_t j = 0; j < s.size(); ++j) {
      const float x = nd(r);
      s[j] = row.law == 0   ? x
             : row.law == 1 ? float(int(r() % 4)) - 1.f
             : row.law == 2 ? 0.1f * x + 4.f * float(j) / float(row.n)
                            : 1.25f;
    }
    std::vector<int32_t> got(topk), ref(topk);
    const bool path = sample_topk_row(s.data(), row.n, topk, got.data());
    DsaTopkParams p;
    p.n_row = 1, p.topk = topk, p.ld = row.n, p.score = s.data(), p.len0 = row.n, p.max_len = row.n;
    p.sel = ref.data();
    dsa_topk_ref(p);
    EXPECT_EQ(got, ref) << "n=" << row.n << " law=" << row.law;
    EXPECT_EQ(path, row.candidates) << "n=" << row.n << " law=" << row.law;
  }
}

TEST(DsaTopk, CheckRejectsBadShapes) {
  std::vector<float> score(10);
  std::vector<int32_t> sel(4);
  DsaTopkParams p;
  p.n_row = 1, p.topk = 4, p.ld = 10, p.max_len = 10, p.len0 = 10, p.score = score.data(), p.sel = sel.data();
  EXPECT_TRUE(dsa_topk_check(p).ok());
  p.cluster = 16;
  EXPECT_TRUE(dsa_topk_check(p).ok());
  p.cluster = 17;
  EXPECT_FALSE(dsa_topk_check(p).ok());  // clusters of 1..16 CTAs
  p.cluster = 0, p.topk = 0;
  EXPECT_FALSE(dsa_topk_check(p).ok());
  p.topk = 4, p.max_len = 11;
  EXPECT_FALSE(dsa_topk_check(p).ok());  // max_len > ld
  p.max_len = 10, p.kernel = DsaTopkKernel::sample;
  EXPECT_TRUE(dsa_topk_check(p).ok());
  p.topk = kDsaTopkSampleMaxK + 1;
  EXPECT_FALSE(dsa_topk_check(p).ok());  // the sample kernel keeps 8192 candidates
}

TEST(DsaIndex, CheckRejectsBadShapes) {
  std::vector<int32_t> table(4, 0);
  std::vector<float> q(32 * 128), w(32), score(256);
  DsaIndexParams p;
  p.cache.d_head = 128, p.cache.page_size = 64, p.cache.max_pages = 4, p.cache.n_pages = 4;
  p.cache.block_table = table.data(), p.cache.pages = score.data();
  p.n_head = 32, p.n_q = 1, p.n_past = 255, p.max_ctx = 256, p.q = q.data(), p.w = w.data();
  p.score = score.data(), p.ld = 256;
  EXPECT_TRUE(dsa_index_check(p).ok());
  p.stages = 4;
  EXPECT_FALSE(dsa_index_check(p).ok());  // 0, 3 or 6 stages
  p.stages = 6;
  EXPECT_TRUE(dsa_index_check(p).ok());
  p.cache.max_pages = (1 << 24) + 1, p.max_ctx = (int64_t(1) << 30) + 1, p.ld = p.max_ctx;
  p.n_past = p.max_ctx - 1;
  EXPECT_FALSE(dsa_index_check(p).ok());  // contexts past 2^30
}

// ---- FP8 vs bf16 index keys on the reference path ----
struct Fp8Study {
  double overlap, nmse;
};

Fp8Study fp8_study(bool structured, int n_q, int ctx, uint64_t seed) {
  const int H = 32, Di = 128, P = 64, topk = 2048, n_pages = (ctx + P - 1) / P;
  std::mt19937_64 r(seed);
  std::normal_distribution<float> nd;
  std::vector<float> keys(size_t(ctx) * Di), latent(8 * size_t(Di));
  for (float& v : latent) v = nd(r);
  for (int s = 0; s < ctx; ++s) {
    float z[8];
    for (float& x : z) x = nd(r);
    for (int e = 0; e < Di; ++e) {
      float v = nd(r);
      if (structured) {  // LayerNorm-like rows: a shared low-rank part and a few outlier channels
        float lr = 0;
        for (int j = 0; j < 8; ++j) lr += z[j] * latent[size_t(j) * Di + e];
        v = 0.4f * v + 0.3f * lr;
        if (e % 41 == 3) v *= 8.f;
      }
      keys[size_t(s) * Di + e] = round_bf16(v);
    }
  }
  std::vector<int32_t> table(static_cast<size_t>(n_pages));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> q(size_t(n_q) * H * Di), w(size_t(n_q) * H);
  for (int i = 0; i < n_q; ++i)
    for (int h = 0; h < H; ++h) {
      const int src = int(r() % uint64_t(ctx));  // structured: each head a noisy copy of one key
      for (int e = 0; e < Di; ++e)
        q[(size_t(i) * H + h) * Di + e] =
            structured ? 0.3f * keys[size_t(src) * Di + e] + 0.1f * nd(r) : 0.3f * nd(r);
    }
  for (float& v : w) v = nd(r);
  std::vector<int32_t> lens(size_t(n_q), ctx);
  std::vector<std::vector<float>> sc(2, std::vector<float>(size_t(n_q) * ctx));
  std::vector<std::vector<int32_t>> sel(2, std::vector<int32_t>(size_t(n_q) * topk));
  for (int f = 0; f < 2; ++f) {
    const DsaKeyFormat fmt = f ? DsaKeyFormat::fp8 : DsaKeyFormat::bf16;
    std::vector<uint8_t> pages(size_t(n_pages) * dsa_key_page_bytes(fmt, P, Di));
    DsaKeyCache c;
    c.fmt = fmt, c.d_head = Di, c.page_size = P, c.max_pages = n_pages, c.n_pages = n_pages;
    c.pages = pages.data(), c.block_table = table.data();
    DsaKeyStoreParams st;
    st.cache = c, st.n_tok = ctx, st.k = keys.data();
    dsa_key_store_ref(st);
    // every query reads the same one-sequence pool: decode form with a shared table row per query
    for (int i = 0; i < n_q; ++i) {
      DsaIndexParams p;
      p.cache = c, p.n_head = H, p.n_q = 1, p.ctx_len = &lens[size_t(i)], p.max_ctx = ctx;
      p.q = q.data() + size_t(i) * H * Di, p.w = w.data() + size_t(i) * H;
      p.q_exact = f == 0;  // both formats score the same fp32 q (fp8: the reference uses q as given)
      p.scale = 1.f / std::sqrt(float(H * Di)), p.score = sc[size_t(f)].data() + size_t(i) * ctx, p.ld = ctx;
      EXPECT_TRUE(dsa_index_check(p).ok());
      dsa_index_ref(p);
    }
    DsaTopkParams t;
    t.n_row = n_q, t.topk = topk, t.ld = ctx, t.score = sc[size_t(f)].data(), t.row_len = lens.data();
    t.max_len = ctx, t.sel = sel[size_t(f)].data();
    dsa_topk_ref(t);
  }
  int64_t same = 0;
  for (int i = 0; i < n_q; ++i) {
    std::vector<int32_t> both;
    std::set_intersection(sel[0].begin() + i * topk, sel[0].begin() + (i + 1) * topk,
                          sel[1].begin() + i * topk, sel[1].begin() + (i + 1) * topk,
                          std::back_inserter(both));
    same += int64_t(both.size());
  }
  double num = 0, den = 0;
  for (size_t j = 0; j < sc[0].size(); ++j)
    num += (double(sc[1][j]) - sc[0][j]) * (double(sc[1][j]) - sc[0][j]), den += double(sc[0][j]) * sc[0][j];
  return {double(same) / (double(n_q) * topk), num / den};
}

TEST(DsaFp8, IndexKeysAgainstBf16OnTheReference) {
  const Fp8Study rnd = fp8_study(false, 4, 8192, 5), str = fp8_study(true, 4, 8192, 6);
  std::printf(
      "[ fp8 vs bf16 index keys, 4 queries x 8192 keys, top-2048: random overlap %.4f score NMSE %.3g; "
      "structured overlap %.4f score NMSE %.3g ]\n",
      rnd.overlap, rnd.nmse, str.overlap, str.nmse);
  EXPECT_LT(rnd.nmse, 3e-3);  // measured 6.9e-4 (random), 1.6e-4 (structured)
  EXPECT_LT(str.nmse, 3e-3);
  EXPECT_GT(rnd.overlap, 0.95);  // measured 0.9835 (random), 0.9933 (structured)
  EXPECT_GT(str.overlap, 0.95);
}

}  // namespace
}  // namespace k3
