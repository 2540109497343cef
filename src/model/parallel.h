// parallel.h: the only door through which a parallel layout enters the model (docs/parallel.md).
//
// Model code calls these hooks at fixed points and contains no rank logic; every default does nothing, so
// a single-rank run (Ctx::par == nullptr, or a plain ParallelHooks) is the ordinary forward pass.
// src/dist implements them: tensor parallel (a row-parallel linear's partial sums and the DSA indexer's
// partial head sums are reduced), expert parallel (routed tokens are dispatched to the ranks owning their
// experts), and KDA context parallel (a sequence split across ranks: the conv halo, the KDA initial state
// of a segment, the MLA/DSA rows of earlier positions). The sharded weights and the smaller per-rank config come from a transform applied
// after binding (Model::load's WeightTransform), never from model files.
// Hooks report failures into *Ctx::guard (the layer loop checks it after every layer).
#pragma once

#include <cstdint>
#include <span>

namespace k3 {

struct Ctx;
struct ModelConfig;
struct KdaSeq;
struct KdaParams;
struct MlaSeq;
struct MlaWeights;
struct MoeWeights;

class ParallelHooks {
 public:
  virtual ~ParallelHooks() = default;

  // y [n]: a partial sum over ranks (a row-parallel linear's fp32 output, before its rounding point).
  virtual void reduce_partial(const Ctx& c, float* y, int64_t n) {}

  // DSA indexer: scores [n] (rows of I[t, s] before the scale, zero where s is not visible) hold the sum over
  // this rank's index heads only; makes them the sum over all heads. Called once per block of scored queries,
  // the same number of times on every rank; the top-k after it must then agree on every rank.
  virtual void reduce_index_scores(const Ctx& c, float* scores, int64_t n) {}

  // MoE: fills slot_out [n_tok * k, dz] with E_{sel[r]}(z[r / k]) for every (token, slot) row r; false lets
  // the model run every expert itself. z: [n_tok, dz] expert inputs, sel: [n_tok, k] expert ids.
  virtual bool moe_experts(const Ctx& c, const ModelConfig& cfg, const MoeWeights& w, const float* z,
                           const int32_t* sel, int64_t n_tok, float* slot_out, int layer) {
    return false;
  }

  // KDA, before the short conv: may set seqs[i].st->conv (the window of pre-conv rows before the first
  // row). q, k, v: pre-conv projections [n_rows, HK] of every sequence in `seqs`.
  virtual void kda_conv_halo(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const float* q,
                             const float* k, const float* v, int64_t HK, int W) {}

  // KDA, before the recurrence: may set seqs[i].st->S. p: the prepared inputs of all rows (q, k, v, g,
  // beta over n_rows tokens; S and o unset).
  virtual void kda_initial_state(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const KdaParams& p) {}

  // MLA / DSA, before the new rows are appended: may fill seqs[i].st->latent (and index_k) with the
  // seqs[i].n_past rows of earlier positions held elsewhere. latent: [n_rows, d_latent] new cache rows;
  // x: [n_rows, D] layer input (the DSA index keys read it).
  virtual void mla_context(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, int layer,
                           std::span<const MlaSeq> seqs, const float* latent, const float* x,
                           int64_t n_rows) {}
};

}  // namespace k3
