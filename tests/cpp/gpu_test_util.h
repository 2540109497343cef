// gpu_test_util.h: what the GPU model tests share: the skip without a device, a switch set for one test, a
// token-by-chunk GPU run and the layer-by-layer bf16 comparison against the CPU. The GPU model's header has
// no CUDA headers, so this builds (and the tests skip) without CUDA.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "gpu/model_gpu.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "model_test_util.h"

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

namespace k3::testutil {

// An environment switch (K3_MLA_FAST=0, ...) set for the guard's scope; the previous value comes back after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Logits of every position of tok on a fresh GPU state, fed in calls of `step` tokens (0: one call).
inline std::vector<float> run_gpu(gpu::GpuModel& m, const std::vector<int32_t>& tok, int64_t step) {
  auto st = m.new_state();
  EXPECT_TRUE(st.ok()) << st.status().message();
  if (!st.ok()) return {};
  const int64_t T = int64_t(tok.size());
  if (step <= 0) step = T;
  std::vector<float> all, part;
  for (int64_t t0 = 0; t0 < T; t0 += step) {
    const int64_t n = std::min(step, T - t0);
    Status s = m.forward(**st, tok.data() + t0, n, &part, true);
    EXPECT_TRUE(s.ok()) << s.message();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// bf16 layer by layer: GpuModel::set_layer_inputs feeds each GPU layer the CPU's input (so every block is
// compared on identical inputs; end to end, bf16 rounding flips compound with depth). For calls of calls[i]
// tokens in turn (random ids from seed), every intermediate the CPU traces must be traced on the GPU too and
// match, NMSE <= 1e-4. on_state sees the new GPU state (e.g. to check which path it took). Call under
// ASSERT_NO_FATAL_FAILURE.
//
// Routing flips (max_flips > 0, for paths whose arithmetic differs from the CPU's: fused kernels): a token
// whose chosen experts (moe_sel) differ in a layer is a near tie that the router-logit difference moved (the
// bias is the same on both sides, so any reordering comes from the logits, whose own check, moe_logits, still
// applies). That token's rows of the routing-dependent intermediates of that layer (moe_weights, moe_routed,
// ffn_out, l_out) are left out of their NMSE; at most max_flips such (token, layer) pairs over all calls.
// With max_flips = 0 a flip fails the test.
inline void expect_bf16_layers_match_cpu(const Checkpoint& ck, const std::vector<int64_t>& calls,
                                         uint32_t seed, const std::string& label,
                                         const std::function<void(const gpu::GpuSeqState&)>& on_state = {},
                                         int max_flips = 0) {
  using Trace = std::map<std::pair<std::string, int>, std::vector<float>>;
  Trace tc, tg;
  ModelOptions oc, og;
  oc.precision = og.precision = Precision::bf16;
  oc.n_threads = 2;
  oc.trace = [&](const char* n, int l, const float* x, int64_t k) { tc[{n, l}].assign(x, x + k); };
  og.trace = [&](const char* n, int l, const float* x, int64_t k) { tg[{n, l}].assign(x, x + k); };
  auto cpu = Model::load(ck, oc);
  auto gpu = gpu::GpuModel::load(ck, og);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  (*gpu)->set_layer_inputs([&](int layer, int64_t n) -> const float* {
    auto it = tc.find({"l_out", layer});
    return it != tc.end() && int64_t(it->second.size()) == n ? it->second.data() : nullptr;
  });
  auto sc = (*cpu)->new_state();
  auto sg = (*gpu)->new_state();
  ASSERT_TRUE(sg.ok()) << sg.status().message();
  if (on_state) on_state(**sg);
  if (::testing::Test::HasFatalFailure()) return;
  const auto tok = random_tokens(std::accumulate(calls.begin(), calls.end(), int64_t(0)), ck.config().n_vocab, seed);
  int64_t t0 = 0;
  int n_flips = 0;
  for (const int64_t n : calls) {
    tc.clear(), tg.clear();
    std::vector<float> lc, lg;
    ASSERT_TRUE((*cpu)->forward(*sc, tok.data() + t0, n, &lc, true).ok());
    Status s = (*gpu)->forward(**sg, tok.data() + t0, n, &lg, true);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_FALSE(tc.empty());
    EXPECT_EQ(tc.size(), tg.size());
    std::map<int, std::vector<bool>> flipped;  // layer -> token
    for (const auto& [key, ref] : tc) {
      if (key.first != "moe_sel") continue;
      auto it = tg.find(key);
      ASSERT_TRUE(it != tg.end() && it->second.size() == ref.size()) << "moe_sel layer " << key.second;
      const size_t k = ref.size() / size_t(n);
      std::vector<bool>& f = flipped[key.second];
      f.assign(size_t(n), false);
      for (size_t t = 0; t < size_t(n); ++t) {
        std::vector<float> a(ref.begin() + t * k, ref.begin() + (t + 1) * k);
        std::vector<float> b(it->second.begin() + t * k, it->second.begin() + (t + 1) * k);
        std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
        if (a != b) {
          f[t] = true;
          ++n_flips;
          std::printf("[ %s: call of %lld tokens, layer %d, token %zu: routing flip ]\n", label.c_str(),
                      (long long)n, key.second, t);
        }
      }
    }
    double worst = 0;
    std::string at;
    for (const auto& [key, ref] : tc) {
      auto it = tg.find(key);
      ASSERT_TRUE(it != tg.end()) << key.first << " layer " << key.second << " not traced on the GPU";
      if (key.first == "moe_sel") continue;  // compared as sets above
      static const char* routed[] = {"moe_weights", "moe_routed", "ffn_out", "l_out"};
      const auto fl = flipped.find(key.second);
      const bool mask = fl != flipped.end() && std::count(fl->second.begin(), fl->second.end(), true) > 0 &&
                        std::find_if(std::begin(routed), std::end(routed),
                                     [&](const char* r) { return key.first == r; }) != std::end(routed);
      std::vector<float> gk, rk;  // the rows of unflipped tokens
      if (mask) {
        const size_t w = ref.size() / size_t(n);
        for (size_t t = 0; t < size_t(n); ++t)
          if (!fl->second[t]) {
            rk.insert(rk.end(), ref.begin() + t * w, ref.begin() + (t + 1) * w);
            gk.insert(gk.end(), it->second.begin() + t * w, it->second.begin() + (t + 1) * w);
          }
        if (rk.empty()) continue;
      }
      const double e = mask ? nmse(gk, rk) : nmse(it->second, ref);
      if (e > worst) worst = e, at = key.first + " layer " + std::to_string(key.second);
      EXPECT_LE(e, 1e-4) << key.first << " layer " << key.second << ", call of " << n << " tokens";
    }
    std::printf("[ %s bf16 layer by layer, %lld tokens: worst intermediate NMSE %.3g (%s) ]\n", label.c_str(),
                (long long)n, worst, at.c_str());
    t0 += n;
  }
  EXPECT_LE(n_flips, max_flips) << label << ": routing flips (token, layer)";
}

}  // namespace k3::testutil
