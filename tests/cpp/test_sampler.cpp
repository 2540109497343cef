// Sampler: exact expectations on hand-made logits (sampler.h gives the chain and its order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace k3 {
namespace {

// Logits whose softmax is exactly `p` (up to a constant).
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> z;
  for (double v : p) z.push_back(float(std::log(v)));
  return z;
}

// Frequencies of ids over n draws with one sampler (seed fixed).
std::map<int32_t, double> frequencies(Sampler& s, const std::vector<float>& z, int n) {
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i) f[s.sample(z, {})] += 1.0 / n;
  return f;
}

TEST(Sampler, GreedyIsArgmaxTiesLowestId) {
  SamplerParams p;
  p.temperature = 0.f;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.f, -1.f, 2.9f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.f, 5.f, 5.f, 5.f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{7.f, 7.f}, {}), 0);
}

TEST(Sampler, TopKOneIsArgmaxForAnySeed) {
  const std::vector<float> z = {0.3f, 1.2f, 1.1f, -4.f, 1.2f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplerParams p;
    p.top_k = 1;
    p.temperature = 1.5f;
    p.seed = seed;
    Sampler s(p);
    EXPECT_EQ(s.sample(z, {}), 1) << "seed " << seed;  // tie 1.2 vs 1.2 -> lower id
  }
}

TEST(Sampler, TopKKeepsExactlyKBest) {
  SamplerParams p;
  p.top_k = 2;
  p.seed = 7;
  Sampler s(p);
  const auto f = frequencies(s, logits_of({0.1, 0.4, 0.2, 0.3}), 4000);
  EXPECT_EQ(f.size(), 2u);
  ASSERT_TRUE(f.count(1) && f.count(3));
  EXPECT_NEAR(f.at(1), 0.4 / 0.7, 0.03);
}

TEST(Sampler, TopPKeepsTheTokenThatCrossesTheBoundary) {
  const auto z = logits_of({0.5, 0.25, 0.125, 0.125});
  auto kept = [&](float top_p) {
    SamplerParams p;
    p.top_p = top_p;
    p.seed = 3;
    Sampler s(p);
    std::set<int32_t> ids;
    for (int i = 0; i < 3000; ++i) ids.insert(s.sample(z, {}));
    return ids;
  };
  EXPECT_EQ(kept(0.45f), (std::set<int32_t>{0}));       // 0.5 already reaches 0.45
  EXPECT_EQ(kept(0.6f), (std::set<int32_t>{0, 1}));     // 0.5 < 0.6 <= 0.75: id 1 crosses, kept
  EXPECT_EQ(kept(0.8f), (std::set<int32_t>{0, 1, 2}));  // 0.875 reaches 0.8; id 3 ties id 2 but loses on id
  EXPECT_EQ(kept(1.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, TopPOverALargeFlatVocabularyKeepsTheLowestIdsOnTies) {
  // 3000 equal logits, top-p 0.5: the kept set is ids 0..1499 (ties -> lower id), which needs the
  // partial sort to grow well past its first 64 candidates.
  SamplerParams p;
  p.top_p = 0.5f;
  p.seed = 17;
  Sampler s(p);
  const std::vector<float> z(3000, 0.25f);
  int32_t hi = 0;
  for (int i = 0; i < 1000; ++i) hi = std::max(hi, s.sample(z, {}));
  EXPECT_LT(hi, 1500);
  EXPECT_GT(hi, 1300);
}

TEST(Sampler, TopPRenormalizesOverTheKeptSet) {
  SamplerParams p;
  p.top_p = 0.6f;
  p.seed = 11;
  Sampler s(p);
  const auto f = frequencies(s, logits_of({0.5, 0.25, 0.125, 0.125}), 6000);
  EXPECT_NEAR(f.at(0), 2.0 / 3.0, 0.025);
  EXPECT_NEAR(f.at(1), 1.0 / 3.0, 0.025);
}

TEST(Sampler, MinPThresholdIsRelativeToTheBest) {
  const auto z = logits_of({0.5, 0.25, 0.13, 0.12});
  auto kept = [&](float min_p) {
    SamplerParams p;
    p.min_p = min_p;
    p.seed = 5;
    Sampler s(p);
    std::set<int32_t> ids;
    for (int i = 0; i < 3000; ++i) ids.insert(s.sample(z, {}));
    return ids;
  };
  EXPECT_EQ(kept(0.3f), (std::set<int32_t>{0, 1}));        // threshold 0.15
  EXPECT_EQ(kept(0.25f), (std::set<int32_t>{0, 1, 2}));    // threshold 0.125: 0.13 in, 0.12 out
  EXPECT_EQ(kept(0.2f), (std::set<int32_t>{0, 1, 2, 3}));  // threshold 0.1
  EXPECT_EQ(kept(1.0f), (std::set<int32_t>{0}));
}

TEST(Sampler, FrequenciesFollowSoftmaxOfScaledLogits) {
  const std::vector<float> z = {1.f, 0.f, -1.f};
  for (float t : {1.0f, 2.0f, 0.5f}) {
    SamplerParams p;
    p.temperature = t;
    p.seed = 42;
    Sampler s(p);
    const auto f = frequencies(s, z, 20000);
    double w[3], sum = 0;
    for (int i = 0; i < 3; ++i) sum += (w[i] = std::exp(z[size_t(i)] / t));
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(f.count(i) ? f.at(i) : 0.0, w[i] / sum, 0.015) << "T=" << t;
  }
}

TEST(Sampler, SeedsAreReproducibleAndDistinct) {
  const std::vector<float> z(64, 0.f);  // uniform: every draw is informative
  auto draws = [&](uint64_t seed) {
    SamplerParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(s.sample(z, {}));
    return ids;
  };
  EXPECT_EQ(draws(1234), draws(1234));
  EXPECT_NE(draws(1234), draws(1235));
  SamplerParams p;
  p.seed = 1234;
  Sampler s(p);
  const auto first = s.sample(z, {});
  s.reseed(1234);
  EXPECT_EQ(s.sample(z, {}), first);
}

TEST(Sampler, RepeatPenaltyDividesPositiveMultipliesNegative) {
  SamplerParams p;
  p.repeat_penalty = 2.f;
  p.repeat_last_n = 3;
  Sampler s(p);
  std::vector<float> z = {2.f, -2.f, 1.f, 0.5f, 4.f};
  const std::vector<int32_t> history = {4, 0, 1, 1, 3};  // window = {1, 1, 3}: id 4 and 0 fell out
  s.apply_bias_and_penalties(z, history);
  EXPECT_FLOAT_EQ(z[0], 2.f);
  EXPECT_FLOAT_EQ(z[1], -4.f);  // penalised once, not once per occurrence
  EXPECT_FLOAT_EQ(z[2], 1.f);
  EXPECT_FLOAT_EQ(z[3], 0.25f);
  EXPECT_FLOAT_EQ(z[4], 4.f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOccurrences) {
  SamplerParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repeat_last_n = -1;  // whole history
  p.logit_bias = {{2, 1.5f}};
  Sampler s(p);
  std::vector<float> z = {1.f, 1.f, 1.f};
  s.apply_bias_and_penalties(z, std::vector<int32_t>{0, 0, 0, 1});
  EXPECT_FLOAT_EQ(z[0], 1.f - 3 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(z[1], 1.f - 1 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(z[2], 2.5f);
}

TEST(Sampler, PenaltyChangesTheGreedyChoice) {
  SamplerParams p;
  p.temperature = 0.f;
  p.repeat_penalty = 1.5f;
  Sampler s(p);
  const std::vector<float> z = {3.f, 2.5f};
  EXPECT_EQ(s.sample(z, {}), 0);
  EXPECT_EQ(s.sample(z, std::vector<int32_t>{0}), 1);  // 3 / 1.5 = 2 < 2.5
}

TEST(Sampler, NegativeInfiniteBiasBansAToken) {
  SamplerParams p;
  p.logit_bias = {{0, -std::numeric_limits<float>::infinity()}};
  p.seed = 9;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) EXPECT_NE(s.sample(std::vector<float>{5.f, 0.f, 0.f}, {}), 0);
  p.temperature = 0.f;
  Sampler g(p);
  EXPECT_EQ(g.sample(std::vector<float>{5.f, 0.f, 1.f}, {}), 2);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  SamplerParams p;
  p.temperature = 0.f;
  p.n_top_logprobs = 2;
  p.logit_bias = {{0, 10.f}};  // changes the choice, not the reported logprobs
  Sampler s(p);
  SampleResult r;
  const std::vector<float> z = {0.f, float(std::log(3.0)), float(std::log(3.0))};
  EXPECT_EQ(s.sample(z, {}, &r), 0);
  EXPECT_EQ(r.id, 0);
  EXPECT_NEAR(r.logprob, std::log(1.0 / 7.0), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 2);
  EXPECT_NEAR(r.top[0].logprob, std::log(3.0 / 7.0), 1e-6);
}

TEST(Sampler, NanAndAllBannedDoNotCrash) {
  SamplerParams p;
  p.seed = 1;
  Sampler s(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(s.sample(std::vector<float>{nan, 1.f, nan}, {}), 1);
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(s.sample(std::vector<float>{ninf, ninf}, {}), 0);
}

TEST(Sampler, ValidateRejectsBadParameters) {
  EXPECT_TRUE(validate(SamplerParams{}, 10).ok());
  auto with = [](auto f) {
    SamplerParams p;
    f(p);
    return validate(p, 10);
  };
  EXPECT_FALSE(with([](SamplerParams& p) { p.temperature = -1.f; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.top_p = 0.f; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.top_p = 1.5f; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.min_p = -0.1f; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.top_k = -2; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.repeat_penalty = 0.f; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.repeat_last_n = -5; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.logit_bias = {{10, 1.f}}; }).ok());
  EXPECT_FALSE(with([](SamplerParams& p) { p.n_top_logprobs = 21; }).ok());
}

}  // namespace
}  // namespace k3
