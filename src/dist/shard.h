// shard.h: one rank's tensor- and expert-parallel layout: the weight transform for Model::load and the
// hooks (model/parallel.h) the model calls. A rank may be in a tensor-parallel group (tp) and an
// expert-parallel group (ep); either may be absent (nullptr or size 1). Usage, per rank thread/process:
//   ShardPlan plan{tp_comm, ep_comm, ep_placement(cfg.moe.n_expert, ep_comm->size())};
//   ShardHooks hooks(plan);  opt.parallel = &hooks;
//   auto model = Model::load(ckpt, opt, shard_transform(plan));
#pragma once

#include <vector>

#include "dist/comm.h"
#include "model/model.h"
#include "model/parallel.h"

namespace k3 {

struct ShardPlan {
  Comm* tp = nullptr;      // heads / GLU width split over tp->size() ranks
  Comm* ep = nullptr;      // routed experts split over ep->size() ranks
  std::vector<int> owner;  // ep: owner[e] = ep rank of expert e (ep_placement)
  bool tp_on() const { return tp && tp->size() > 1; }
  bool ep_on() const { return ep && ep->size() > 1; }
};

// tp_shard then ep_shard for this rank.
WeightTransform shard_transform(const ShardPlan& plan);

class ShardHooks final : public ParallelHooks {
 public:
  explicit ShardHooks(ShardPlan plan) : plan_(std::move(plan)) {}
  void reduce_partial(const Ctx& c, float* y, int64_t n) override;
  void reduce_index_scores(const Ctx& c, float* scores, int64_t n) override;
  bool moe_experts(const Ctx& c, const ModelConfig& cfg, const MoeWeights& w, const float* z,
                   const int32_t* sel, int64_t n_tok, float* slot_out, int layer) override;

 private:
  ShardPlan plan_;
};

}  // namespace k3
