// ep.h: expert parallelism for the routed experts (MODEL.md §8.2-8.3), applied from outside the model.
//
// Placement: expert e lives on rank owner[e]; every rank holds ceil(E/n) or fewer experts. With per-expert
// loads (routed token counts from a calibration run) the greedy longest-processing-time rule balances the
// summed load: heaviest expert first, to the least loaded rank that still has room. Without loads every
// expert weighs the same and the placement is round robin.
//
// One MoE layer, activations replicated on every rank (as after a tensor-parallel reduce):
//   1. rank r takes the token slice [r T/n, (r+1) T/n) and its routing (sel computed by every rank alike)
//   2. dispatch: all_to_allv of the (token, slot) rows, expert input z [dz] and expert id, to owner[id]
//   3. each rank runs its experts over the rows it received (per expert in ascending row order, the same
//      batches a single rank would form)
//   4. combine: all_to_allv of the expert outputs back to the source rank, then all_gatherv of the
//      per-slot outputs, so every rank holds slot_out for all tokens; the weighted slot sum, the latent
//      norm/up-projection and the shared expert stay in moe.cpp
// Counts are exchanged first with an all_gather of the n x n send-count matrix.
#pragma once

#include <span>
#include <vector>

#include "core/status.h"
#include "dist/comm.h"
#include "k3/config.h"

namespace k3 {

struct Ctx;
struct ModelWeights;
struct MoeWeights;

// owner[e] for e < n_expert; load: empty or one weight per expert.
std::vector<int> ep_placement(int n_expert, int n_rank, std::span<const double> load = {});
// Drops the routed experts rank `rank` does not own (their weights become empty: never read).
Status ep_shard(const ModelConfig& cfg, ModelWeights& w, std::span<const int> owner, int rank);
// Steps 1-4 above for one layer; slot_out [n_tok * k, dz] complete on return on every rank.
Status ep_run_experts(Comm& comm, std::span<const int> owner, const Ctx& c, const ModelConfig& cfg,
                      const MoeWeights& w, const float* z, const int32_t* sel, int64_t n_tok,
                      float* slot_out);

}  // namespace k3
