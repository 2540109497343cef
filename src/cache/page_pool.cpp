// page_pool.cpp: the shared page allocator (page_pool.h).
#include "cache/page_pool.h"

#include <string>

namespace k3 {

const char* page_kind_name(PageKind k) {
  switch (k) {
    case PageKind::free:
      return "free";
    case PageKind::mla_latent:
      return "mla_latent";
    case PageKind::dsa_index:
      return "dsa_index";
    case PageKind::kda_state:
      return "kda_state";
  }
  return "?";
}

PagePool::PagePool(int64_t page_bytes, int32_t n_pages)
    : page_bytes_(page_bytes), bytes_(size_t(page_bytes * n_pages)), meta_(size_t(n_pages)) {
  K3_ASSERT(page_bytes > 0 && n_pages >= 0);
  free_.reserve(size_t(n_pages));
  for (PageId p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // low ids first
}

void PagePool::check(PageId p) const {
  K3_ASSERT(p >= 0 && size_t(p) < meta_.size());
}

Result<PageId> PagePool::alloc(PageKind kind) {
  K3_ASSERT(kind != PageKind::free);
  if (free_.empty()) {
    if (lru_.empty())
      return error(Code::out_of_memory, "page pool exhausted: all " + std::to_string(meta_.size()) +
                                            " pages of " + std::to_string(page_bytes_) +
                                            " bytes are held or pinned");
    PageId victim = lru_.front();
    if (evict_hook_) evict_hook_(victim);  // the index forgets the page (and may drop its siblings)
    if (meta_[size_t(victim)].kind != PageKind::free) {
      from_lru(victim);
      free_page(victim);
    }
  }
  PageId p = free_.back();
  free_.pop_back();
  Meta& m = meta_[size_t(p)];
  m = Meta{};
  m.kind = kind;
  m.ref = 1;
  return p;
}

void PagePool::retain(PageId p) {
  check(p);
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(m.kind != PageKind::free);
  if (m.in_lru) from_lru(p);
  m.ref++;
}

void PagePool::release(PageId p) {
  check(p);
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(m.kind != PageKind::free && m.ref > 0);
  if (--m.ref > 0) return;
  if (!m.cached) {
    if (m.pin == 0) free_page(p);
  } else if (m.pin == 0) {
    to_lru(p);
  }
}

void PagePool::pin(PageId p) {
  check(p);
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(m.kind != PageKind::free);
  if (m.in_lru) from_lru(p);
  m.pin++;
}

void PagePool::unpin(PageId p) {
  check(p);
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(m.pin > 0);
  if (--m.pin > 0 || m.ref > 0) return;
  if (m.cached)
    to_lru(p);
  else
    free_page(p);
}

void PagePool::set_cached(PageId p, bool cached) {
  check(p);
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(m.kind != PageKind::free);
  m.cached = cached;
  if (!cached && m.in_lru) {
    from_lru(p);
    free_page(p);
  }
}

void PagePool::drop(PageId p) {
  check(p);
  Meta& m = meta_[size_t(p)];
  if (m.kind == PageKind::free) return;
  m.cached = false;
  if (m.in_lru) from_lru(p);
  if (m.ref == 0 && m.pin == 0) free_page(p);
}

void PagePool::to_lru(PageId p) {
  Meta& m = meta_[size_t(p)];
  K3_ASSERT(!m.in_lru);
  m.lru = lru_.insert(lru_.end(), p);
  m.in_lru = true;
}

void PagePool::from_lru(PageId p) {
  Meta& m = meta_[size_t(p)];
  lru_.erase(m.lru);
  m.in_lru = false;
}

void PagePool::free_page(PageId p) {
  meta_[size_t(p)] = Meta{};
  free_.push_back(p);
}

std::span<std::byte> PagePool::data(PageId p, PageKind expect) {
  check(p);
#ifndef NDEBUG
  K3_ASSERT(meta_[size_t(p)].kind == expect && "mistyped page access");
#endif
  return {bytes_.data() + size_t(p) * size_t(page_bytes_), size_t(page_bytes_)};
}

std::span<const std::byte> PagePool::data(PageId p, PageKind expect) const {
  check(p);
#ifndef NDEBUG
  K3_ASSERT(meta_[size_t(p)].kind == expect && "mistyped page access");
#endif
  return {bytes_.data() + size_t(p) * size_t(page_bytes_), size_t(page_bytes_)};
}

Result<std::span<std::byte>> PagePool::checked_data(PageId p, PageKind expect) {
  if (p < 0 || size_t(p) >= meta_.size())
    return error(Code::out_of_range, "page " + std::to_string(p) + " is outside the pool");
  if (meta_[size_t(p)].kind != expect)
    return error(Code::internal, "page " + std::to_string(p) + " holds " + page_kind_name(kind(p)) +
                                     ", read as " + page_kind_name(expect));
  return data(p, expect);
}

}  // namespace k3
