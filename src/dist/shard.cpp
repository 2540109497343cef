// shard.cpp: the tensor/expert-parallel transform and hooks (shard.h).
#include "dist/shard.h"

#include "dist/ep.h"
#include "dist/tp.h"
#include "model/common.h"

namespace k3 {

namespace {

void fail(const Ctx& c, const Status& s) {
  if (c.guard && c.guard->ok() && !s.ok()) *c.guard = s;
}

}  // namespace

WeightTransform shard_transform(const ShardPlan& plan) {
  return [plan](ModelConfig& cfg, ModelWeights& w) -> Status {
    if (plan.tp_on()) K3_RETURN_IF_ERROR(tp_shard(cfg, w, plan.tp->rank(), plan.tp->size()));
    if (plan.ep_on()) K3_RETURN_IF_ERROR(ep_shard(cfg, w, plan.owner, plan.ep->rank()));
    return ok_status();
  };
}

void ShardHooks::reduce_partial(const Ctx& c, float* y, int64_t n) {
  if (plan_.tp_on()) fail(c, plan_.tp->all_reduce_sum(y, n).with_context("tensor-parallel reduce"));
}

// tp_shard splits the index heads over every tensor-parallel rank (a rank may hold none), so the scores
// are always partial under TP.
void ShardHooks::reduce_index_scores(const Ctx& c, float* scores, int64_t n) {
  if (plan_.tp_on()) fail(c, plan_.tp->all_reduce_sum(scores, n).with_context("DSA index-score reduce"));
}

bool ShardHooks::moe_experts(const Ctx& c, const ModelConfig& cfg, const MoeWeights& w, const float* z,
                             const int32_t* sel, int64_t n_tok, float* slot_out, int layer) {
  if (!plan_.ep_on()) return false;
  fail(c, ep_run_experts(*plan_.ep, plan_.owner, c, cfg, w, z, sel, n_tok, slot_out)
              .with_context("expert-parallel layer " + std::to_string(layer)));
  return true;
}

}  // namespace k3
