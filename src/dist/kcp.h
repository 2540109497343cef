// kcp.h: KDA context parallelism for prefill: one packed token sequence (several documents, cu_seqlens)
// split into contiguous slices, slice r on rank r (docs/parallel.md).
//
// Each rank runs the ordinary model over its slice, cut at document starts into local pieces; piece 0
// "continues" when its document started on an earlier rank. Per layer, through the hooks of parallel.h:
//   KDA conv   the last W-1 pre-conv q~, k~, v~ rows before a slice (the halo) come point to point from the
//              previous rank, which forwards its own tail window (a chain: a slice shorter than W-1 passes
//              on rows it received)
//   KDA state  every rank computes, for its last piece, (M, S~) = kda_transition (from a zero state) or,
//              when that piece starts fresh on this rank, (0, its final state); one all_gather; a
//              continuing piece starts from S = fold_{j<r} (S <- M_j S + S~_j). 2 K^2 floats per head and
//              rank: independent of the sequence length. A document starting inside a rank starts from 0.
//   MLA / DSA  all_gatherv of the new cache rows (the d_latent-wide latent, and the DSA index keys, which
//              are recomputed from x exactly as dsa.h does); a continuing piece's cache gets the rows of its
//              document before the slice, and its n_past counts them
// Norms, FFN, MoE and AttnRes are per token: the block representations of AttnRes are materialized once
// per rank for its own rows, nothing crosses ranks. After the prefill, the rank holding the end of a
// document holds a complete SeqState for it (cache rows, KDA state and conv window) to decode from.
#pragma once

#include <memory>
#include <vector>

#include "dist/comm.h"
#include "model/model.h"
#include "model/parallel.h"

namespace k3 {

struct KcpLayout {
  std::vector<int64_t> cu_seqlens;  // [n_doc + 1] document starts in the packed sequence; 0 first, T last
  std::vector<int64_t> rank_start;  // [n_rank + 1] first token of each slice; 0 first, T last
  int n_rank() const { return int(rank_start.size()) - 1; }
  // Even split of T = cu_seqlens.back() tokens (every slice non-empty); invalid_argument on bad input.
  static Result<KcpLayout> even(std::vector<int64_t> cu_seqlens, int n_rank);
  Status validate() const;
};

struct KcpPiece {
  int64_t t0 = 0, t1 = 0;  // global rows [t0, t1) of one document, inside one slice
  int64_t doc_start = 0;   // first row of its document
  bool continues() const { return doc_start < t0; }
};
std::vector<KcpPiece> kcp_pieces(const KcpLayout& layout, int rank);

class KcpHooks final : public ParallelHooks {
 public:
  // A layout that does not validate, or whose rank count is not comm.size(), leaves status() not ok (and no
  // pieces); kcp_prefill returns it.
  KcpHooks(Comm& comm, KcpLayout layout);
  const Status& status() const { return status_; }
  const KcpLayout& layout() const { return layout_; }
  const std::vector<KcpPiece>& pieces() const { return pieces_; }

  void kda_conv_halo(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const float* q, const float* k,
                     const float* v, int64_t HK, int W) override;
  void kda_initial_state(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const KdaParams& p) override;
  void mla_context(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, int layer,
                   std::span<const MlaSeq> seqs, const float* latent, const float* x,
                   int64_t n_rows) override;

 private:
  Comm& comm_;
  KcpLayout layout_;
  std::vector<KcpPiece> pieces_;
  Status status_;
};

// Runs this rank's slice (model loaded with opt.parallel = &hooks; every rank calls it). tokens: the whole
// packed sequence [T]; logits: [slice length, n_vocab] for the rank's own rows; states: one per piece.
Status kcp_prefill(Model& model, const KcpHooks& hooks, const int32_t* tokens, std::vector<float>* logits,
                   std::vector<std::unique_ptr<SeqState>>* states);

}  // namespace k3
