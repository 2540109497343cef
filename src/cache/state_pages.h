// state_pages.h: how a sequence's cache state lies in pool pages (docs/cache.md), and the copies
// between a SeqState (the model's private, contiguous working state) and those pages.
//
//   physical block b of a sequence = positions [b*T_blk, (b+1)*T_blk), one page per attention layer:
//     latent page  [T_blk, d_latent] fp32   rows [c | r] of MLA/DSA layer l        (PageKind::mla_latent)
//     index page   [T_blk, d_index]  fp32   DSA index keys of layer l (DSA layers)  (PageKind::dsa_index)
//   KDA checkpoint of layer l (one cache group per KDA layer) = its state packed head by head:
//     head h: S[h] [K, V] then conv rows conv[c, r, h*K:(h+1)*K] for c < 3, r < W-1   -> K*V + 3(W-1)K floats
//     the H heads one after another, cut into ceil(bytes / page_bytes) pages      (PageKind::kda_state)
// page_bytes = T_blk * d_latent * 4, so every kind shares one page size (an index page uses its first
// T_blk * d_index * 4 bytes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/page_pool.h"
#include "k3/config.h"
#include "model/state.h"

namespace k3 {

struct StateLayout {
  int block_tokens = 0;          // T_blk
  std::vector<int> attn_layers;  // MLA and DSA layers, ascending
  std::vector<int> dsa_layers;   // the DSA ones
  std::vector<int> kda_layers;   // ascending; one checkpoint group each
  int64_t d_latent = 0, d_index = 0;
  int64_t kda_head_floats = 0;                  // K*V + 3(W-1)K
  int kda_heads = 0, kda_d = 0, conv_rows = 0;  // H, K, W-1
  int64_t page_bytes = 0;
  int pages_per_block() const { return int(attn_layers.size() + dsa_layers.size()); }
  int pages_per_kda_group() const;

  static StateLayout make(const ModelConfig& cfg, int block_tokens);
};

// Block page order: the latent page of each attention layer, then the index page of each DSA layer.
// Rows [row0, row0 + n) of block `pages` <- state positions [pos0, pos0 + n).
void store_rows(PagePool& pool, const StateLayout& L, std::span<const PageId> pages, int64_t row0,
                const SeqState& st, int64_t pos0, int64_t n);
// State rows appended: positions [pos0, pos0 + n) <- rows [row0, row0 + n) (the state holds pos0 rows).
void load_rows(const PagePool& pool, const StateLayout& L, std::span<const PageId> pages, int64_t row0,
               SeqState& st, int64_t n);
// Copies rows [0, n) of block `src` into block `dst` (a private copy of a partly matched block).
void copy_rows(PagePool& pool, const StateLayout& L, std::span<const PageId> src, std::span<const PageId> dst,
               int64_t n);

// KDA group g (layer L.kda_layers[g]) of `st` <-> its checkpoint pages.
void store_kda(PagePool& pool, const StateLayout& L, int g, std::span<const PageId> pages,
               const SeqState& st);
void load_kda(const PagePool& pool, const StateLayout& L, int g, std::span<const PageId> pages, SeqState& st);

}  // namespace k3
