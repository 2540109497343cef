// PrefixCache on a synthetic state (no model): hits restore exactly what a cold run computes, hits end
// inside physical blocks, and each of seed 002's three consistency rules is exercised by a scenario that
// goes wrong when the rule is switched off.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cache/prefix_index.h"

namespace k3 {
namespace {

ModelConfig fake_config(bool with_kda) {
  ModelConfig c;
  c.layer_attn = with_kda ? std::vector<AttnKind>{AttnKind::kda, AttnKind::mla, AttnKind::kda, AttnKind::mla}
                          : std::vector<AttnKind>{AttnKind::mla, AttnKind::mla};
  c.n_layer = int(c.layer_attn.size());
  c.kda.n_head = 2, c.kda.d_head = 4, c.kda.conv_size = 4;
  c.mla.kv_lora_rank = 6, c.mla.d_rope = 2;
  return c;
}

// What a model would append: rows that depend on (layer, position, token) and a KDA state that depends
// on the whole prefix.
void fake_forward(const ModelConfig& c, SeqState& st, std::span<const int32_t> ids) {
  const int64_t n = st.n_past(), dl = c.mla.d_latent();
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.layer_attn[size_t(l)] == AttnKind::kda) {
      KdaState& s = st.kda[size_t(l)];
      for (int32_t id : ids) {
        for (size_t i = 0; i < s.S.size(); ++i)
          s.S[i] = 0.5f * s.S[i] + float(id % 7 + l) * 0.01f * float(i % 5 + 1);
        for (size_t i = 0; i < s.conv.size(); ++i)
          s.conv[i] = 0.25f * s.conv[i] + float(id) * 0.001f + float(i);
      }
    } else {
      for (size_t t = 0; t < ids.size(); ++t)
        for (int64_t d = 0; d < dl; ++d)
          st.mla[size_t(l)].latent.push_back(float(l * 100) + float(n + int64_t(t)) * 0.5f +
                                             float(ids[t]) * 0.01f + float(d) * 0.001f);
    }
  }
  st.set_n_past(n + int64_t(ids.size()));
}

void expect_same_state(const SeqState& a, const SeqState& b) {
  ASSERT_EQ(a.n_past(), b.n_past());
  for (size_t l = 0; l < a.kda.size(); ++l) {
    EXPECT_EQ(a.kda[l].S, b.kda[l].S) << "layer " << l;
    EXPECT_EQ(a.kda[l].conv, b.kda[l].conv) << "layer " << l;
    EXPECT_EQ(a.mla[l].latent, b.mla[l].latent) << "layer " << l;
  }
}

std::vector<int32_t> ids(int n, int seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = (i * 31 + seed * 17) % 97;
  return v;
}

// A sequence through the cache: admit, then forwards ending at `ends`, each committed, one step each.
struct Runner {
  Runner(const ModelConfig& c, PrefixCache& pc) : cfg(c), cache(pc) {}
  const ModelConfig& cfg;
  PrefixCache& cache;
  SeqCache sc;
  SeqState st{cfg};
  int64_t hit = -1;
  Status run(const std::vector<int32_t>& prompt, const std::vector<int64_t>& ends) {
    K3_ASSIGN_OR_RETURN(hit, cache.admit(sc, prompt, st));
    for (int64_t e : ends) {
      if (e <= st.n_past()) continue;
      std::span<const int32_t> chunk(prompt.data() + st.n_past(), size_t(e - st.n_past()));
      K3_RETURN_IF_ERROR(cache.reserve(sc, chunk));
      fake_forward(cfg, st, chunk);
      K3_RETURN_IF_ERROR(cache.commit(sc, st));
      SeqCache* p = &sc;
      cache.end_step(std::span<SeqCache*>(&p, 1));
    }
    return ok_status();
  }
};

SeqState cold(const ModelConfig& cfg, std::span<const int32_t> prefix) {
  SeqState st(cfg);
  fake_forward(cfg, st, prefix);
  return st;
}

TEST(CachePrefix, HashChainCoversThePrefix) {
  std::vector<int32_t> a = ids(32, 1), b = a;
  b[3] ^= 1;
  Hash128 ha = chain_hash(chain_hash({}, std::span(a).subspan(0, 16)), std::span(a).subspan(16, 16));
  Hash128 hb = chain_hash(chain_hash({}, std::span(b).subspan(0, 16)), std::span(b).subspan(16, 16));
  EXPECT_FALSE(ha == hb);  // the second block's hash changes with a token of the first
}

TEST(CachePrefix, HitInsideABlockEqualsColdRun) {
  ModelConfig cfg = fake_config(true);
  CacheOptions o;
  o.block_tokens = 64, o.hash_tokens = 16, o.n_pages = 64;
  PrefixCache cache(StateLayout::make(cfg, 64), o);
  std::vector<int32_t> p1 = ids(100, 1);
  Runner a(cfg, cache);
  ASSERT_TRUE(a.run(p1, {32, 64, 96, 100}).ok());
  EXPECT_EQ(a.hit, 0);
  EXPECT_EQ(cache.n_checkpoints(), 1);  // 32 and 64 superseded, 96 = the prompt's turn boundary
  cache.release(a.sc, true);
  // Turn 2: the whole turn 1 plus more; the hit is 96 = 6 hash blocks, 32 rows into block 1.
  std::vector<int32_t> p2 = p1;
  for (int32_t t : ids(50, 2)) p2.push_back(t);
  Runner b(cfg, cache);
  ASSERT_TRUE(b.run(p2, {}).ok());
  EXPECT_EQ(b.hit, 96);
  expect_same_state(b.st, cold(cfg, std::span(p2).subspan(0, 96)));
  // Continuing from the hit equals the cold run of the whole prompt.
  std::span<const int32_t> rest(p2.data() + 96, p2.size() - 96);
  ASSERT_TRUE(cache.reserve(b.sc, rest).ok());
  fake_forward(cfg, b.st, rest);
  ASSERT_TRUE(cache.commit(b.sc, b.st).ok());
  expect_same_state(b.st, cold(cfg, p2));
  // A diverging request matches only the aligned common prefix that has a checkpoint.
  std::vector<int32_t> p3 = p1;
  p3[90] += 1;
  EXPECT_EQ(cache.lookup(p3, int64_t(p3.size()) - 1), 0);  // 80 is matched by MLA but has no checkpoint
  cache.release(b.sc, true);
}

TEST(CachePrefix, PoolReturnsToBaselineAfterRelease) {
  ModelConfig cfg = fake_config(true);
  CacheOptions o;
  o.block_tokens = 32, o.hash_tokens = 16, o.n_pages = 32;
  PrefixCache cache(StateLayout::make(cfg, 32), o);
  Runner a(cfg, cache);
  ASSERT_TRUE(a.run(ids(40, 3), {40}).ok());  // 40 is not aligned: no checkpoint
  EXPECT_EQ(cache.n_checkpoints(), 0);
  cache.release(a.sc, false);
  // The full block (registered) stays cached and evictable; the tail block (no complete hash block,
  // never registered) is free again.
  EXPECT_EQ(cache.pool().n_used(), cache.pool().n_evictable());
  EXPECT_EQ(cache.pool().n_used(), cache.layout().pages_per_block());
}

// Rule 1: the hit's pages are pinned before admit() allocates the private copy block.
void rule_pin_scenario(bool rule, bool* admitted, bool* state_ok) {
  ModelConfig cfg = fake_config(true);
  CacheOptions o;
  o.block_tokens = 32, o.hash_tokens = 16, o.rule_pin = rule;
  StateLayout L = StateLayout::make(cfg, 32);
  o.n_pages = 2 * L.pages_per_block() + 2 * L.pages_per_kda_group();  // exactly turn 1's pages
  PrefixCache cache(L, o);
  std::vector<int32_t> p1 = ids(48, 4);
  Runner a(cfg, cache);
  ASSERT_TRUE(a.run(p1, {48}).ok());
  cache.release(a.sc, true);
  ASSERT_EQ(cache.pool().n_free(), 0);
  std::vector<int32_t> p2 = p1;
  for (int32_t t : ids(5, 5)) p2.push_back(t);
  SeqCache sc;
  SeqState st(cfg);
  Result<int64_t> hit = cache.admit(sc, p2, st);
  *admitted = hit.ok();
  *state_ok = false;
  if (hit.ok()) {
    SeqState ref = cold(cfg, std::span(p2).subspan(0, size_t(*hit)));
    *state_ok = st.n_past() == 48 && st.kda[0].S == ref.kda[0].S && st.kda[2].S == ref.kda[2].S &&
                st.mla[1].latent == ref.mla[1].latent && st.mla[3].latent == ref.mla[3].latent;
    cache.release(sc, false);
  } else {
    EXPECT_EQ(hit.status().code(), Code::out_of_memory);
    EXPECT_EQ(cache.lookup(p2, 52), 48);                           // nothing was lost
    EXPECT_EQ(cache.pool().n_used(), cache.pool().n_evictable());  // and nothing is held
  }
}

TEST(CachePrefix, Rule1PinHitBeforeAllocating) {
  bool admitted = false, ok = false;
  rule_pin_scenario(true, &admitted, &ok);
  EXPECT_FALSE(admitted);  // no room for the private copy without evicting the hit: refused cleanly
#ifdef NDEBUG
  rule_pin_scenario(false, &admitted, &ok);
  EXPECT_TRUE(admitted);
  EXPECT_FALSE(ok);  // the copy evicted the checkpoint it was restoring: a wrong state
#else
  EXPECT_DEATH(rule_pin_scenario(false, &admitted, &ok), "mistyped");  // debug builds catch the reuse
#endif
}

// Rule 2: endpoints registered in this step are not matched before their bytes landed.
TEST(CachePrefix, Rule2ExcludeFreshEntries) {
  for (bool rule : {true, false}) {
    ModelConfig cfg = fake_config(false);
    CacheOptions o;
    o.block_tokens = 32, o.hash_tokens = 16, o.n_pages = 32, o.rule_exclude_fresh = rule;
    PrefixCache cache(StateLayout::make(cfg, 32), o);
    std::vector<int32_t> p = ids(40, 6);
    SeqCache sa;
    SeqState sta(cfg);
    ASSERT_TRUE(cache.admit(sa, p, sta).ok());
    ASSERT_TRUE(cache.reserve(sa, p).ok());  // planned: endpoints 16, 32 registered, rows not written yet
    SeqCache sb;
    SeqState stb(cfg);
    Result<int64_t> hit = cache.admit(sb, p, stb);
    ASSERT_TRUE(hit.ok());
    if (rule) {
      EXPECT_EQ(*hit, 0);
    } else {
      EXPECT_EQ(*hit, 32);
      EXPECT_NE(stb.mla[0].latent, cold(cfg, std::span(p).subspan(0, 32)).mla[0].latent);  // unwritten rows
    }
    cache.release(sb, false);
    fake_forward(cfg, sta, p);
    ASSERT_TRUE(cache.commit(sa, sta).ok());
    SeqCache* s = &sa;
    cache.end_step(std::span<SeqCache*>(&s, 1));
    SeqCache sc;
    SeqState stc(cfg);
    EXPECT_EQ(cache.admit(sc, p, stc).value(), 32);  // landed: now it matches, with the right rows
    expect_same_state(stc, cold(cfg, std::span(p).subspan(0, 32)));
    cache.release(sc, false);
    cache.release(sa, false);
  }
}

// Rule 3: evicting one KDA group's checkpoint page drops the checkpoint in every group.
TEST(CachePrefix, Rule3EvictionDropsSiblingGroups) {
  for (bool rule : {true, false}) {
    ModelConfig cfg = fake_config(true);
    CacheOptions o;
    o.block_tokens = 32, o.hash_tokens = 16, o.rule_drop_siblings = rule;
    StateLayout L = StateLayout::make(cfg, 32);
    ASSERT_EQ(L.pages_per_kda_group(), 1);
    o.n_pages = 2 * L.pages_per_block() + 2 + 2;
    PrefixCache cache(L, o);
    std::vector<int32_t> p = ids(48, 7);
    Runner a(cfg, cache);
    ASSERT_TRUE(a.run(p, {48}).ok());
    cache.release(a.sc, true);
    ASSERT_EQ(cache.lookup(p, 48), 48);
    ASSERT_EQ(cache.pool().n_free(), 2);
    PagePool& pool = cache.pool();
    ASSERT_TRUE(pool.alloc(PageKind::mla_latent).ok());
    ASSERT_TRUE(pool.alloc(PageKind::mla_latent).ok());
    ASSERT_TRUE(
        pool.alloc(PageKind::mla_latent).ok());  // evicts the oldest cached page: group 0's checkpoint
    EXPECT_EQ(cache.lookup(p, 48), 0);           // no restorable checkpoint at 48 (nor below)
    if (rule) {
      EXPECT_EQ(cache.n_checkpoints(), 0);
      EXPECT_EQ(pool.n_free(), 1);  // group 1's page came back with it
    } else {
      EXPECT_EQ(cache.n_checkpoints(), 1);  // a half checkpoint nobody can use...
      EXPECT_EQ(pool.n_free(), 0);          // ...still holding group 1's page
    }
  }
}

// Dense checkpoints: a prompt fed in hash-block forwards keeps a checkpoint at every boundary, so a later
// prompt that diverges at p resumes at floor(p / T_h) T_h; the default keeps only the turn boundary.
TEST(CachePrefix, DenseCheckpointsResumeWithinOneHashBlockOfADivergence) {
  for (bool dense : {false, true}) {
    ModelConfig cfg = fake_config(true);
    CacheOptions o;
    o.block_tokens = 64, o.hash_tokens = 16, o.n_pages = 128, o.dense_checkpoints = dense;
    PrefixCache cache(StateLayout::make(cfg, 64), o);
    std::vector<int32_t> p1 = ids(120, 8);
    Runner a(cfg, cache);
    ASSERT_TRUE(a.run(p1, {16, 32, 48, 64, 80, 96, 112, 120}).ok());
    cache.release(a.sc, true);
    EXPECT_EQ(cache.n_checkpoints(), dense ? 7 : 1);
    for (int p : {20, 47, 70, 100}) {
      std::vector<int32_t> q = p1;
      q[size_t(p)] += 1;
      const int64_t hit = cache.lookup(q, int64_t(q.size()) - 1);
      EXPECT_EQ(hit, dense ? p / 16 * 16 : 0) << "divergence at " << p;
      if (dense && hit > 0) {  // and what it restores is the cold state of that prefix
        SeqCache sc;
        SeqState st(cfg);
        ASSERT_EQ(cache.admit(sc, q, st).value(), hit);
        expect_same_state(st, cold(cfg, std::span(q).subspan(0, size_t(hit))));
        cache.release(sc, false);
      }
    }
  }
}

}  // namespace
}  // namespace k3
