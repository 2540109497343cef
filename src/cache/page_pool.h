// page_pool.h: one pool of fixed-size byte pages shared by every cache kind (docs/cache.md, seed 002).
//
//   pages [n_pages][page_bytes]      one allocation; a page id indexes it
//   kind[p]   free | mla_latent | dsa_index | kda_state     (the tag a reader states when it touches p)
//   ref[p]    owners (requests, cache entries) that keep p alive
//   pin[p]    short holds inside one scheduling step (rule 1: hit pages pinned before any allocation)
//   cached[p] p is registered in a prefix index: at ref 0 it stays readable and joins the LRU list
//
// alloc(kind): a free page, else evicts the least recently released cached page with ref 0 and pin 0
// (the eviction hook runs first, so an index drops every entry that names the page), else
// out_of_memory as a Status: an exhausted pool never crashes. release() at ref 0 frees an uncached
// page and parks a cached one in the LRU list. data(p, kind) checks the tag in debug builds (abort on a
// mistyped access); checked_data() always checks and returns a Status. Not thread-safe: the scheduler
// thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <vector>

#include "core/status.h"

namespace k3 {

using PageId = int32_t;

enum class PageKind : uint8_t { free, mla_latent, dsa_index, kda_state };
const char* page_kind_name(PageKind k);

class PagePool {
 public:
  PagePool(int64_t page_bytes, int32_t n_pages);

  int64_t page_bytes() const { return page_bytes_; }
  int32_t n_pages() const { return int32_t(meta_.size()); }
  int32_t n_free() const { return int32_t(free_.size()); }
  int32_t n_evictable() const { return int32_t(lru_.size()); }
  // Pages held (ref > 0) or cached; n_used() + n_free() == n_pages().
  int32_t n_used() const { return n_pages() - n_free(); }

  // A page of `kind` with ref 1, uncached.
  Result<PageId> alloc(PageKind kind);
  void retain(PageId p);
  void release(PageId p);
  void pin(PageId p);
  void unpin(PageId p);
  // Marks p as registered in an index (kept after its last release) or not (freed at ref 0).
  void set_cached(PageId p, bool cached);
  // Frees a cached page with ref 0 now (an index dropping an entry it no longer wants).
  void drop(PageId p);

  PageKind kind(PageId p) const { return meta_[size_t(p)].kind; }
  int32_t ref(PageId p) const { return meta_[size_t(p)].ref; }
  int32_t pins(PageId p) const { return meta_[size_t(p)].pin; }
  bool cached(PageId p) const { return meta_[size_t(p)].cached; }

  std::span<std::byte> data(PageId p, PageKind expect);
  std::span<const std::byte> data(PageId p, PageKind expect) const;
  Result<std::span<std::byte>> checked_data(PageId p, PageKind expect);

  // Called with a page about to be evicted (still tagged and readable); the hook may drop() other
  // pages (siblings of a checkpoint) but must not allocate.
  void set_evict_hook(std::function<void(PageId)> hook) { evict_hook_ = std::move(hook); }

 private:
  struct Meta {
    PageKind kind = PageKind::free;
    int32_t ref = 0, pin = 0;
    bool cached = false;
    std::list<PageId>::iterator lru;  // valid while in lru_
    bool in_lru = false;
  };
  void check(PageId p) const;
  void to_lru(PageId p);
  void from_lru(PageId p);
  void free_page(PageId p);

  int64_t page_bytes_;
  std::vector<std::byte> bytes_;  // [n_pages * page_bytes]
  std::vector<Meta> meta_;        // [n_pages]
  std::vector<PageId> free_;      // stack of free ids
  std::list<PageId> lru_;         // evictable (cached, ref 0, pin 0), least recent first
  std::function<void(PageId)> evict_hook_;
};

}  // namespace k3
