// model_test_util.h: helpers shared by the model-level tests (paths, GPU = CPU, parallel layouts).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace k3::testutil {

// n token ids uniform in [0, vocab), reproducible from seed.
inline std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

// sum((y - ref)^2) / sum(ref^2) (the plain sum when ref is all zero); sizes must match.
inline double nmse(const std::vector<float>& y, const std::vector<float>& ref) {
  EXPECT_EQ(y.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(y.size(), ref.size()); ++i) {
    const double d = double(y[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace k3::testutil
