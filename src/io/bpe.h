// bpe.h: tiktoken byte-pair encoding of one pre-token piece (FORMATS.md §1.1).
//
// ranks: token bytes -> rank (= id), dense 0..n_base-1, every single byte present.
// encode_piece(piece):
//   if rank(piece) exists: [rank(piece)]                                   (whole-piece fast path)
//   else parts = single bytes; while some adjacent pair (p_i, p_i+1) has rank(p_i ++ p_i+1):
//          merge the pair with the lowest such rank (leftmost on ties)
//        -> [rank(p) for p in parts]
// Two equivalent implementations: merge_linear rescans all pairs per merge (O(n^2), fastest for the short
// pieces of real text), merge_heap keeps a linked list + min-heap keyed by (rank, byte offset), so leftmost
// ties resolve the same way, in O(n log n) for long pieces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace k3 {

struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};

class BpeRanks {
 public:
  using Map = std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>>;
  BpeRanks() = default;
  explicit BpeRanks(Map ranks) : ranks_(std::move(ranks)) {}

  std::optional<int32_t> rank(std::string_view bytes) const {
    auto it = ranks_.find(bytes);
    if (it == ranks_.end()) return std::nullopt;
    return it->second;
  }
  size_t size() const { return ranks_.size(); }

  // Appends the ids of `piece` (non-empty) to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_linear(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view piece, std::vector<int32_t>& out) const;

  static constexpr size_t kLinearMaxBytes = 128;  // longer pieces go to merge_heap

 private:
  Map ranks_;
};

}  // namespace k3
