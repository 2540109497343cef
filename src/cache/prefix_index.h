// prefix_index.h: the hybrid prefix cache over one PagePool (docs/cache.md, seed 002 "hybrid prefix cache").
//
// Two granularities: physical blocks of T_blk tokens (the allocation unit; state_pages.h) and hash blocks
// of T_h tokens (T_blk % T_h == 0). Chained hashes over hash blocks:
//   h_0 = 0,  h_j = XXH3_128(seed = lo(h_{j-1}), bytes = hi(h_{j-1}) ++ tokens[(j-1)T_h, j T_h))
// so a match of h_j proves the whole prefix [0, j T_h) (and every hit is still compared token by token).
// Every complete hash block of a block registers its endpoint h_j -> (block, j); a partly filled block is
// findable at its last complete endpoint, which advances as it fills.
// KDA checkpoints: after a forward that ends at a hash-aligned position p, every KDA layer (one cache
// group each) snapshots S and conv into pages under key h_{p/T_h}. A sequence's superseded checkpoint is
// dropped unless it is a turn boundary (the last aligned position of a prompt, or of a finished sequence).
//
// Lookup (at most n_max tokens): MLA level walks the blocks by the hash at each block end, then inside the
// first missing block falls back to the endpoints h_j, largest first -> matched length M; KDA level needs a
// checkpoint in every group -> hit = the longest multiple of T_h <= M that has one (M itself for a model
// without KDA layers). Rules (seed 002):
//   1. every page of the hit (blocks, checkpoint) is pinned before admit() allocates anything;
//   2. endpoints and checkpoints registered in the current step are not matched until end_step()
//      (their bytes land when the step's forward and copies ran);
//   3. evicting a page of one group's checkpoint drops the checkpoint in every group at once (and a block
//      page drops its whole block).
// Single-threaded: the scheduler thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/page_pool.h"
#include "cache/state_pages.h"
#include "core/status.h"

namespace k3 {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128&) const = default;
};
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};
Hash128 chain_hash(Hash128 parent, std::span<const int32_t> tokens);

struct CacheOptions {
  int block_tokens = 64;  // T_blk, a multiple of hash_tokens
  int hash_tokens = 16;   // T_h
  int32_t n_pages = 256;
  // Keep every checkpoint (one per hash boundary: the runner then ends a forward at each) instead of
  // dropping superseded ones: a divergence at p then resumes at floor(p / T_h) T_h, at the price of one
  // KDA state per hash block (evictable, least recently written first).
  bool dense_checkpoints = false;
  bool rule_pin = true;  // the three rules can be switched off only to show (in tests) what breaks
  bool rule_exclude_fresh = true;
  bool rule_drop_siblings = true;
};

// What one sequence holds in the cache.
struct SeqCache {
  std::vector<int32_t> blocks;       // block table: blocks[b] covers positions [b T_blk, (b+1) T_blk)
  std::vector<int32_t> tokens;       // ids reserved so far (fed or about to be fed)
  std::vector<Hash128> hashes;       // hashes[j-1] = h_j for every complete hash block of `tokens`
  int64_t n_saved = 0;               // positions whose rows are in pages
  int64_t n_prompt = 0;              // turn boundary: the last aligned position <= n_prompt is kept
  std::optional<Hash128> last_ckpt;  // this sequence's newest intermediate checkpoint
  std::vector<PageId> pins;          // rule 1 pins, released at end_step()
  int64_t n_cached = 0;              // tokens restored from the cache at admission
};

struct CacheStats {
  int64_t lookups = 0, hit_tokens = 0, checkpoints = 0, blocks_registered = 0;
};

class PrefixCache {
 public:
  PrefixCache(const StateLayout& layout, const CacheOptions& opt);

  const StateLayout& layout() const { return L_; }
  const CacheOptions& options() const { return opt_; }
  PagePool& pool() { return pool_; }
  const CacheStats& stats() const { return stats_; }

  // Longest usable prefix of `tokens` (<= n_max) without taking anything: its length.
  int64_t lookup(std::span<const int32_t> tokens, int64_t n_max) const;
  // A new sequence with `prompt`: finds the hit (<= prompt size - 1, so a token is left to compute logits),
  // pins it (rule 1), shares its full blocks, copies a partly used block into a private one, restores
  // latent rows / index keys / KDA state into the fresh `st`. Returns the hit length. On out_of_memory
  // nothing is held.
  Result<int64_t> admit(SeqCache& s, std::span<const int32_t> prompt, SeqState& st);
  // Reserves pages for `ids` about to be fed (positions s.tokens.size()...) and registers the hash
  // endpoints they complete (matchable from the next step on, rule 2). out_of_memory leaves s unchanged.
  Status reserve(SeqCache& s, std::span<const int32_t> ids);
  // After a forward: copies the new rows [n_saved, st.n_past()) into pages and, at an aligned position,
  // writes a KDA checkpoint (an older intermediate one of this sequence is dropped).
  Status commit(SeqCache& s, const SeqState& st);
  // The sequence ends (finished, cancelled or preempted): keeps its last checkpoint as a turn boundary
  // when keep_last, releases its blocks (registered ones stay cached until evicted).
  void release(SeqCache& s, bool keep_last);
  // Copies have landed: fresh entries become matchable, rule-1 pins are released.
  void end_step(std::span<SeqCache*> seqs);

  int64_t step() const { return step_; }
  int32_t n_checkpoints() const { return int32_t(ckpts_.size()); }

 private:
  struct Block {
    std::vector<PageId> pages;    // [pages_per_block]
    std::vector<int32_t> tokens;  // ids stored in it (<= T_blk)
    int32_t n_ends = 0;           // complete hash blocks in it
    std::vector<Hash128> keys;    // endpoints it registered
    bool live = false;
  };
  struct Endpoint {
    int32_t block;
    int32_t j;     // complete hash blocks in the block at this endpoint
    int64_t step;  // registered in this step
  };
  struct Checkpoint {
    int64_t n_tok = 0;
    std::vector<std::vector<PageId>> groups;  // [n_kda_layers][pages_per_kda_group]
    bool kept = false;                        // turn boundary
    int64_t step = 0;
  };
  struct Owner {
    enum class Kind : uint8_t { none, block, ckpt } kind = Kind::none;
    int32_t block = -1;
    Hash128 key;
  };
  struct Match {
    int64_t n = 0;                // hit length
    std::vector<int32_t> blocks;  // blocks covering [0, n) (the last one maybe partly)
    std::optional<Hash128> ckpt;
  };

  Match find(std::span<const int32_t> tokens, int64_t n_max) const;
  bool fresh(int64_t step) const { return opt_.rule_exclude_fresh && step == step_; }
  Result<int32_t> new_block();
  void free_block(int32_t b);   // evicted: forget it whole
  void unref_block(int32_t b);  // a sequence lets go of it
  void drop_ckpt(const Hash128& key);
  void on_evict(PageId p);
  Status write_ckpt(SeqCache& s, const SeqState& st, int64_t pos);

  StateLayout L_;
  CacheOptions opt_;
  PagePool pool_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_blocks_;
  std::unordered_map<Hash128, Endpoint, Hash128Hasher> ends_;
  std::unordered_map<Hash128, Checkpoint, Hash128Hasher> ckpts_;
  std::vector<Owner> owner_;  // [n_pages]
  int64_t step_ = 1;
  CacheStats stats_;
};

}  // namespace k3
