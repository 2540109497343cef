// prefix_index.cpp: blocks, hash endpoints, KDA checkpoints and the two-level lookup (prefix_index.h).
#include "cache/prefix_index.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace k3 {

Hash128 chain_hash(Hash128 parent, std::span<const int32_t> tokens) {
  std::vector<std::byte> buf(8 + tokens.size() * 4);
  std::memcpy(buf.data(), &parent.hi, 8);
  std::memcpy(buf.data() + 8, tokens.data(), tokens.size() * 4);
  XXH128_hash_t h = XXH3_128bits_withSeed(buf.data(), buf.size(), parent.lo);
  return {h.low64, h.high64};
}

namespace {

// h_1..h_n over the complete hash blocks of tokens[0, n_max).
std::vector<Hash128> chain_all(std::span<const int32_t> tokens, int64_t n_max, int th) {
  std::vector<Hash128> h;
  Hash128 prev;
  for (int64_t e = th; e <= n_max; e += th)
    h.push_back(prev = chain_hash(prev, tokens.subspan(size_t(e - th), size_t(th))));
  return h;
}

}  // namespace

PrefixCache::PrefixCache(const StateLayout& layout, const CacheOptions& opt)
    : L_(layout), opt_(opt), pool_(layout.page_bytes, opt.n_pages), owner_(size_t(opt.n_pages)) {
  K3_ASSERT(opt.hash_tokens > 0 && opt.block_tokens % opt.hash_tokens == 0);
  K3_ASSERT(layout.block_tokens == opt.block_tokens && !layout.attn_layers.empty());
  pool_.set_evict_hook([this](PageId p) { on_evict(p); });
}

PrefixCache::Match PrefixCache::find(std::span<const int32_t> tokens, int64_t n_max) const {
  const int T = opt_.block_tokens, Th = opt_.hash_tokens, per = T / Th;
  n_max = std::min<int64_t>(n_max, int64_t(tokens.size()));
  const std::vector<Hash128> h = chain_all(tokens, n_max, Th);
  const int64_t n_hash = int64_t(h.size());
  auto same = [&](int32_t b, int64_t start, int64_t n) {
    const std::vector<int32_t>& bt = blocks_[size_t(b)].tokens;
    return int64_t(bt.size()) >= n && std::equal(bt.begin(), bt.begin() + n, tokens.begin() + start);
  };
  Match m;
  int64_t M = 0;
  for (int64_t start = 0;; start += T) {
    const int64_t h0 = start / Th;
    if (h0 + per <= n_hash) {  // the whole block: by the hash at its end
      auto it = ends_.find(h[size_t(h0 + per - 1)]);
      if (it != ends_.end() && it->second.j == per && !fresh(it->second.step) &&
          same(it->second.block, start, T)) {
        m.blocks.push_back(it->second.block);
        M = start + T;
        continue;
      }
    }
    // the first missing block: its hash endpoints, longest first
    for (int64_t j = std::min<int64_t>(per, n_hash - h0); j >= 1; --j) {
      auto it = ends_.find(h[size_t(h0 + j - 1)]);
      if (it == ends_.end() || it->second.j != j || fresh(it->second.step)) continue;
      if (!same(it->second.block, start, j * Th)) continue;
      m.blocks.push_back(it->second.block);
      M = start + j * Th;
      break;
    }
    break;
  }
  if (L_.kda_layers.empty()) {
    m.n = M;
  } else {
    for (int64_t p = M / Th * Th; p >= Th && m.n == 0; p -= Th) {
      auto it = ckpts_.find(h[size_t(p / Th - 1)]);
      if (it == ckpts_.end() || fresh(it->second.step)) continue;
      bool all = std::all_of(it->second.groups.begin(), it->second.groups.end(),
                             [](const std::vector<PageId>& g) { return !g.empty(); });
      if (!all) continue;
      m.n = p;
      m.ckpt = it->first;
    }
  }
  m.blocks.resize(size_t((m.n + T - 1) / T));
  return m;
}

int64_t PrefixCache::lookup(std::span<const int32_t> tokens, int64_t n_max) const {
  return find(tokens, n_max).n;
}

Result<int32_t> PrefixCache::new_block() {
  std::vector<PageId> pages;
  for (int i = 0; i < L_.pages_per_block(); ++i) {
    const PageKind kind = i < int(L_.attn_layers.size()) ? PageKind::mla_latent : PageKind::dsa_index;
    Result<PageId> p = pool_.alloc(kind);
    if (!p.ok()) {
      for (PageId q : pages) pool_.release(q);
      return p.status();
    }
    pages.push_back(*p);
  }
  int32_t b;
  if (!free_blocks_.empty()) {
    b = free_blocks_.back();
    free_blocks_.pop_back();
  } else {
    b = int32_t(blocks_.size());
    blocks_.emplace_back();
  }
  Block& blk = blocks_[size_t(b)];
  blk = Block{};
  blk.pages = pages;
  blk.live = true;
  for (PageId p : pages) owner_[size_t(p)] = {Owner::Kind::block, b, {}};
  return b;
}

void PrefixCache::free_block(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  if (!blk.live) return;
  for (const Hash128& k : blk.keys) {
    auto it = ends_.find(k);
    if (it != ends_.end() && it->second.block == b) ends_.erase(it);
  }
  blk.live = false;
  for (PageId p : blk.pages) {
    owner_[size_t(p)] = {};
    pool_.drop(p);
  }
  blk = Block{};
  free_blocks_.push_back(b);
}

void PrefixCache::drop_ckpt(const Hash128& key) {
  auto it = ckpts_.find(key);
  if (it == ckpts_.end()) return;
  for (auto& g : it->second.groups)
    for (PageId p : g) {
      owner_[size_t(p)] = {};
      pool_.drop(p);
    }
  ckpts_.erase(it);
}

void PrefixCache::on_evict(PageId p) {
  const Owner o = owner_[size_t(p)];
  if (o.kind == Owner::Kind::block) {
    free_block(o.block);
  } else if (o.kind == Owner::Kind::ckpt) {
    if (opt_.rule_drop_siblings) return drop_ckpt(o.key);  // rule 3: every group at once
    auto it = ckpts_.find(o.key);
    for (auto& g : it->second.groups)
      if (std::find(g.begin(), g.end(), p) != g.end()) {
        for (PageId q : g) owner_[size_t(q)] = {}, pool_.drop(q);
        g.clear();
      }
  }
}

Result<int64_t> PrefixCache::admit(SeqCache& s, std::span<const int32_t> prompt, SeqState& st) {
  K3_ASSERT(st.n_past() == 0 && s.blocks.empty());
  stats_.lookups++;
  const int T = opt_.block_tokens, Th = opt_.hash_tokens;
  s.n_prompt = int64_t(prompt.size());
  Match m = find(prompt, int64_t(prompt.size()) - 1);
  if (m.n == 0) return int64_t(0);
  // Rule 1: pin everything the hit reads before allocating anything.
  auto pin = [&](PageId p) {
    if (!opt_.rule_pin) return;
    pool_.pin(p);
    s.pins.push_back(p);
  };
  const std::vector<std::vector<PageId>> ckpt_pages =
      m.ckpt ? ckpts_.at(*m.ckpt).groups : std::vector<std::vector<PageId>>{};
  for (int32_t b : m.blocks)
    for (PageId p : blocks_[size_t(b)].pages) pin(p);
  for (const auto& g : ckpt_pages)
    for (PageId p : g) pin(p);
  const int64_t n_full = m.n / T, rem = m.n - n_full * T;
  for (int64_t i = 0; i < n_full; ++i) {
    for (PageId p : blocks_[size_t(m.blocks[size_t(i)])].pages) pool_.retain(p);
    s.blocks.push_back(m.blocks[size_t(i)]);
  }
  if (rem > 0) {  // a private copy of the partly used block
    Result<int32_t> nb = new_block();
    if (!nb.ok()) {
      release(s, false);
      return nb.status();
    }
    const int32_t src = m.blocks[size_t(n_full)];
    copy_rows(pool_, L_, blocks_[size_t(src)].pages, blocks_[size_t(*nb)].pages, rem);
    Block& blk = blocks_[size_t(*nb)];
    blk.tokens.assign(prompt.begin() + n_full * T, prompt.begin() + m.n);
    blk.n_ends = int32_t(rem / Th);
    s.blocks.push_back(*nb);
  }
  for (size_t i = 0; i < s.blocks.size(); ++i)
    load_rows(pool_, L_, blocks_[size_t(s.blocks[i])].pages, 0, st,
              std::min<int64_t>(T, m.n - int64_t(i) * T));
  for (int g = 0; g < int(ckpt_pages.size()); ++g) load_kda(pool_, L_, g, ckpt_pages[size_t(g)], st);
  st.set_n_past(m.n);
  s.tokens.assign(prompt.begin(), prompt.begin() + m.n);
  s.hashes = chain_all(prompt, m.n, Th);
  s.n_saved = m.n;
  s.n_cached = m.n;
  stats_.hit_tokens += m.n;
  return m.n;
}

Status PrefixCache::reserve(SeqCache& s, std::span<const int32_t> ids) {
  const int T = opt_.block_tokens, Th = opt_.hash_tokens;
  const int64_t n0 = int64_t(s.tokens.size()), n1 = n0 + int64_t(ids.size());
  const size_t n_blocks0 = s.blocks.size();
  while (int64_t(s.blocks.size()) * T < n1) {
    Result<int32_t> nb = new_block();
    if (!nb.ok()) {
      while (s.blocks.size() > n_blocks0) {
        unref_block(s.blocks.back());
        s.blocks.pop_back();
      }
      return nb.status();
    }
    s.blocks.push_back(*nb);
  }
  for (int64_t pos = n0; pos < n1; ++pos) {
    const int32_t b = s.blocks[size_t(pos / T)];
    Block& blk = blocks_[size_t(b)];
    s.tokens.push_back(ids[size_t(pos - n0)]);
    blk.tokens.push_back(ids[size_t(pos - n0)]);
    if ((pos + 1) % Th) continue;
    Hash128 prev = s.hashes.empty() ? Hash128{} : s.hashes.back();
    const Hash128 h =
        chain_hash(prev, std::span<const int32_t>(s.tokens).subspan(size_t(pos + 1 - Th), size_t(Th)));
    s.hashes.push_back(h);
    blk.n_ends++;
    if (ends_.count(h)) continue;  // another block holds this prefix already
    ends_[h] = {b, int32_t(((pos + 1) - (pos / T) * T) / Th), step_};
    blk.keys.push_back(h);
    for (PageId p : blk.pages) pool_.set_cached(p, true);
    stats_.blocks_registered++;
  }
  return ok_status();
}

Status PrefixCache::commit(SeqCache& s, const SeqState& st) {
  const int T = opt_.block_tokens, Th = opt_.hash_tokens;
  const int64_t n = st.n_past();
  if (n > int64_t(s.tokens.size()))
    return error(Code::internal, "cache commit: the state holds " + std::to_string(n) + " positions, only " +
                                     std::to_string(s.tokens.size()) + " reserved");
  for (int64_t pos = s.n_saved; pos < n;) {
    const int64_t row = pos % T, cnt = std::min<int64_t>(T - row, n - pos);
    store_rows(pool_, L_, blocks_[size_t(s.blocks[size_t(pos / T)])].pages, row, st, pos, cnt);
    pos += cnt;
  }
  s.n_saved = n;
  if (!L_.kda_layers.empty() && n > 0 && n % Th == 0) return write_ckpt(s, st, n);
  return ok_status();
}

Status PrefixCache::write_ckpt(SeqCache& s, const SeqState& st, int64_t pos) {
  const int Th = opt_.hash_tokens;
  const Hash128 key = s.hashes[size_t(pos / Th - 1)];
  if (ckpts_.count(key)) return ok_status();  // someone saved this boundary already
  Checkpoint c;
  c.n_tok = pos;
  c.step = step_;
  c.kept = pos == s.n_prompt / Th * Th;
  for (int g = 0; g < int(L_.kda_layers.size()); ++g) {
    std::vector<PageId> pages;
    for (int i = 0; i < L_.pages_per_kda_group(); ++i) {
      Result<PageId> p = pool_.alloc(PageKind::kda_state);
      if (!p.ok()) {  // the cache is best effort: no room for a checkpoint is not an error
        for (PageId q : pages) pool_.release(q);
        for (auto& gr : c.groups)
          for (PageId q : gr) pool_.release(q);
        return ok_status();
      }
      pages.push_back(*p);
    }
    c.groups.push_back(std::move(pages));
  }
  for (int g = 0; g < int(c.groups.size()); ++g) {
    store_kda(pool_, L_, g, c.groups[size_t(g)], st);
    for (PageId p : c.groups[size_t(g)]) {
      owner_[size_t(p)] = {Owner::Kind::ckpt, -1, key};
      pool_.set_cached(p, true);
      pool_.release(p);
    }
  }
  ckpts_[key] = std::move(c);
  stats_.checkpoints++;
  if (s.last_ckpt && !opt_.dense_checkpoints) {  // superseded, unless it marks a turn boundary
    auto it = ckpts_.find(*s.last_ckpt);
    if (it != ckpts_.end() && !it->second.kept) drop_ckpt(*s.last_ckpt);
  }
  s.last_ckpt = key;
  return ok_status();
}

void PrefixCache::unref_block(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  if (!blk.live) return;
  for (PageId p : blk.pages) pool_.release(p);
  if (pool_.kind(blk.pages[0]) != PageKind::free) return;  // registered: cached until evicted
  for (const Hash128& k : blk.keys) ends_.erase(k);
  for (PageId p : blk.pages) owner_[size_t(p)] = {};
  blk = Block{};
  free_blocks_.push_back(b);
}

void PrefixCache::release(SeqCache& s, bool keep_last) {
  if (keep_last && s.last_ckpt) {
    auto it = ckpts_.find(*s.last_ckpt);
    if (it != ckpts_.end()) it->second.kept = true;
  }
  for (PageId p : s.pins) pool_.unpin(p);
  for (int32_t b : s.blocks) unref_block(b);
  s = SeqCache{};
}

void PrefixCache::end_step(std::span<SeqCache*> seqs) {
  for (SeqCache* s : seqs) {
    for (PageId p : s->pins) pool_.unpin(p);
    s->pins.clear();
  }
  step_++;
}

}  // namespace k3
