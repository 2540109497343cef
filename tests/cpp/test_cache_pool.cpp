// PagePool: allocation, reference counts, LRU eviction of cached pages, pinning, exhaustion as a
// Status, and the page kind tag.
#include <gtest/gtest.h>

#include <vector>

#include "cache/page_pool.h"

namespace k3 {
namespace {

TEST(CachePool, AllocReleaseReturnsToBaseline) {
  PagePool pool(64, 4);
  std::vector<PageId> got;
  for (int i = 0; i < 4; ++i) {
    auto p = pool.alloc(PageKind::mla_latent);
    ASSERT_TRUE(p.ok());
    got.push_back(*p);
  }
  EXPECT_EQ(pool.n_free(), 0);
  auto none = pool.alloc(PageKind::kda_state);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::out_of_memory);
  for (PageId p : got) pool.release(p);
  EXPECT_EQ(pool.n_free(), 4);
}

TEST(CachePool, RefCountKeepsPageAlive) {
  PagePool pool(16, 1);
  PageId p = pool.alloc(PageKind::dsa_index).value();
  pool.retain(p);
  pool.release(p);
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_EQ(pool.ref(p), 1);
  pool.release(p);
  EXPECT_EQ(pool.n_free(), 1);
}

TEST(CachePool, CachedPagesEvictLeastRecentFirst) {
  PagePool pool(16, 3);
  std::vector<PageId> evicted;
  pool.set_evict_hook([&](PageId p) { evicted.push_back(p); });
  PageId a = pool.alloc(PageKind::mla_latent).value(), b = pool.alloc(PageKind::mla_latent).value(),
         c = pool.alloc(PageKind::kda_state).value();
  for (PageId p : {a, b, c}) pool.set_cached(p, true);
  pool.release(b);  // b is now least recently released
  pool.release(a);
  pool.release(c);
  EXPECT_EQ(pool.n_evictable(), 3);
  EXPECT_EQ(pool.n_free(), 0);
  PageId d = pool.alloc(PageKind::dsa_index).value();
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], b);
  EXPECT_EQ(d, b);
  EXPECT_EQ(pool.kind(d), PageKind::dsa_index);
  EXPECT_FALSE(pool.cached(d));
  // A cached page that is used again (retain) leaves the LRU list and cannot be evicted.
  pool.retain(a);
  PageId e = pool.alloc(PageKind::mla_latent).value();
  EXPECT_EQ(e, c);
  EXPECT_FALSE(pool.alloc(PageKind::mla_latent).ok());
}

TEST(CachePool, PinnedPagesAreNotEvicted) {
  PagePool pool(16, 2);
  PageId a = pool.alloc(PageKind::mla_latent).value(), b = pool.alloc(PageKind::mla_latent).value();
  pool.set_cached(a, true);
  pool.set_cached(b, true);
  pool.pin(a);
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.n_evictable(), 1);
  PageId c = pool.alloc(PageKind::kda_state).value();
  EXPECT_EQ(c, b);
  auto full = pool.alloc(PageKind::kda_state);
  EXPECT_FALSE(full.ok());  // a is pinned
  pool.unpin(a);
  EXPECT_TRUE(pool.alloc(PageKind::kda_state).ok());
}

TEST(CachePool, UncachingFreesAnIdlePage) {
  PagePool pool(16, 2);
  PageId a = pool.alloc(PageKind::mla_latent).value();
  pool.set_cached(a, true);
  pool.release(a);
  EXPECT_EQ(pool.n_free(), 1);
  pool.drop(a);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_EQ(pool.kind(a), PageKind::free);
}

TEST(CachePool, MistypedAccessIsDetected) {
  PagePool pool(32, 2);
  PageId p = pool.alloc(PageKind::kda_state).value();
  EXPECT_TRUE(pool.checked_data(p, PageKind::kda_state).ok());
  auto bad = pool.checked_data(p, PageKind::mla_latent);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kda_state"), std::string::npos);
  EXPECT_FALSE(pool.checked_data(7, PageKind::kda_state).ok());
#ifndef NDEBUG
  EXPECT_DEATH(pool.data(p, PageKind::mla_latent), "mistyped");
#endif
  EXPECT_EQ(pool.data(p, PageKind::kda_state).size(), 32u);
}

}  // namespace
}  // namespace k3
