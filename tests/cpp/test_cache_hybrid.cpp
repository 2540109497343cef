// The hybrid prefix cache on the tiny checkpoints (fp32): a prefix-cache hit gives the logits of a cold
// run (NMSE <= 1e-6), including a hit that ends inside a physical block, over a conversation that grows
// turn by turn (each turn = the previous prompt + its greedy reply + new tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/runner.h"
#include "io/checkpoint.h"

namespace k3 {
namespace {

double nmse(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(y[i]) - ref[i]) * (double(y[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return num / std::max(den, 1e-30);
}

std::vector<int32_t> tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

int32_t argmax(const std::vector<float>& z) {
  return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
}

class CacheHybrid : public ::testing::TestWithParam<std::string> {};

TEST_P(CacheHybrid, HitEqualsColdRunOverGrowingTurns) {
  auto ck = Checkpoint::open(std::string(K3_SOURCE_DIR) + "/models/" + GetParam());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  ModelOptions mo;
  mo.n_threads = 2;
  auto model = Model::load(**ck, mo);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Model& m = **model;
  const ModelConfig& cfg = m.config();
  CacheOptions co;
  co.block_tokens = 64, co.hash_tokens = 16, co.n_pages = 256;
  PrefixCache cache(StateLayout::make(cfg, co.block_tokens), co);

  std::vector<int32_t> prompt = tokens(70, cfg.n_vocab, 1);
  int64_t expect_hit = 0;
  bool inside_block = false;
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    SeqCache sc;
    auto st = m.new_state();
    auto hit = cache.admit(sc, prompt, *st);
    ASSERT_TRUE(hit.ok()) << hit.status().message();
    EXPECT_EQ(*hit, expect_hit);
    inside_block |= *hit % co.block_tokens != 0;
    std::vector<float> logits, ref;
    SeqSlot slot{st.get(), &sc};
    ASSERT_TRUE(feed(m, &cache, slot, std::span(prompt).subspan(size_t(*hit)), &logits).ok());
    auto cold = m.new_state();
    ASSERT_TRUE(m.forward(*cold, prompt.data(), int64_t(prompt.size()), &ref, false).ok());
    EXPECT_LE(nmse(logits, ref), 1e-6);
    // Greedy reply, one token per call (decode), then the turn ends.
    std::vector<int32_t> reply;
    for (int i = 0; i < 9; ++i) {
      reply.push_back(argmax(logits));
      ASSERT_TRUE(feed(m, &cache, slot, std::span(&reply.back(), 1), &logits).ok());
    }
    SeqCache* p = &sc;
    cache.end_step(std::span<SeqCache*>(&p, 1));
    const int64_t n_end = st->n_past();
    cache.release(sc, true);
    // Next turn: this one's tokens + new ones. Its hit is the last aligned position <= n_end that holds
    // a kept checkpoint (the end of this turn); 96 lies inside the 64-token block [64, 128).
    prompt.insert(prompt.end(), reply.begin(), reply.end());
    std::vector<int32_t> more = tokens(13 + 5 * turn, cfg.n_vocab, 10 + uint32_t(turn));
    prompt.insert(prompt.end(), more.begin(), more.end());
    expect_hit = n_end / 16 * 16;
  }
  EXPECT_TRUE(inside_block);  // turn hits: 64 (a block end), then 96 (inside a block)
}

INSTANTIATE_TEST_SUITE_P(Tiny, CacheHybrid, ::testing::Values("tiny-kl", "tiny-k3", "tiny-k31"));

}  // namespace
}  // namespace k3
