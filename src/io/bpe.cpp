// bpe.cpp: lowest-rank-first pair merging of one piece. See bpe.h.
#include "io/bpe.h"

#include <xxhash.h>

#include <limits>
#include <queue>

#include "core/status.h"

namespace k3 {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

}  // namespace

size_t BytesHash::operator()(std::string_view s) const noexcept { return XXH3_64bits(s.data(), s.size()); }

void BpeRanks::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (auto r = rank(piece)) {
    out.push_back(*r);
    return;
  }
  if (piece.size() <= kLinearMaxBytes)
    merge_linear(piece, out);
  else
    merge_heap(piece, out);
}

void BpeRanks::merge_linear(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  // start[k]: byte offset where part k begins; start[n_parts] = n. pair[k]: rank of parts k ++ k+1.
  std::vector<size_t> start(n + 1);
  for (size_t k = 0; k <= n; ++k) start[k] = k;
  auto pair_rank = [&](size_t k) {  // parts k and k+1 exist
    if (k + 2 >= start.size()) return kNoRank;
    auto r = rank(piece.substr(start[k], start[k + 2] - start[k]));
    return r ? *r : kNoRank;
  };
  std::vector<int32_t> pair(n);
  for (size_t k = 0; k < n; ++k) pair[k] = pair_rank(k);
  while (true) {
    size_t best = 0;
    int32_t best_rank = kNoRank;
    for (size_t k = 0; k + 1 < start.size() - 1; ++k)
      if (pair[k] < best_rank) best_rank = pair[k], best = k;
    if (best_rank == kNoRank) break;
    start.erase(start.begin() + best + 1);
    pair.erase(pair.begin() + best + 1);
    pair[best] = pair_rank(best);
    if (best > 0) pair[best - 1] = pair_rank(best - 1);
  }
  for (size_t k = 0; k + 1 < start.size(); ++k) {
    auto r = rank(piece.substr(start[k], start[k + 1] - start[k]));
    K3_ASSERT(r.has_value());  // single bytes are validated at load; merges only form ranked strings
    out.push_back(*r);
  }
}

void BpeRanks::merge_heap(std::string_view piece, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  // Part k starts at byte k (its first byte never changes); next[k] = the following part (n = end).
  std::vector<int> next(n), prev(n), version(n, 0);
  std::vector<bool> alive(n, true);
  for (int k = 0; k < n; ++k) next[k] = k + 1, prev[k] = k - 1;
  auto end_of = [&](int k) { return next[k]; };
  auto pair_rank = [&](int k) {  // rank of part k ++ next part
    if (next[k] >= n) return kNoRank;
    const int e = end_of(next[k]);
    auto r = rank(piece.substr(k, e - k));
    return r ? *r : kNoRank;
  };
  struct Cand {
    int32_t rank;
    int k, version;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : k > o.k; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  for (int k = 0; k + 1 < n; ++k)
    if (int32_t r = pair_rank(k); r != kNoRank) heap.push({r, k, 0});
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.k] || version[c.k] != c.version) continue;  // stale: part changed since it was queued
    const int j = next[c.k];                                  // absorb part j into part k
    alive[j] = false;
    next[c.k] = next[j];
    if (next[j] < n) prev[next[j]] = c.k;
    ++version[c.k];
    if (int32_t r = pair_rank(c.k); r != kNoRank) heap.push({r, c.k, version[c.k]});
    if (const int p = prev[c.k]; p >= 0) {
      ++version[p];
      if (int32_t r = pair_rank(p); r != kNoRank) heap.push({r, p, version[p]});
    }
  }
  for (int k = 0; k < n; k = next[k]) {
    auto r = rank(piece.substr(k, next[k] - k));
    K3_ASSERT(r.has_value());
    out.push_back(*r);
  }
}

}  // namespace k3
