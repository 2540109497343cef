// test_dist_util.h: helpers of the parallel tests (test_dist*.cpp, test_kcp*.cpp): ranks as threads, the
// tiny checkpoints, NMSE, and a regrouped-heads view of a K3 checkpoint so that 4 divides the KDA heads.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "model/model.h"
#include "model_test_util.h"

namespace k3::disttest {

inline std::unique_ptr<Checkpoint> open_tiny(const std::string& name) {
  auto r = Checkpoint::open(std::string(K3_SOURCE_DIR) + "/models/" + name);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

inline ModelOptions test_options() {
  ModelOptions o;
  o.n_threads = 1;  // ranks are threads already
  o.kda_chunk = 16;
  return o;
}

using testutil::nmse;
using testutil::random_tokens;

// Runs f(rank) on n threads and joins them.
inline void run_ranks(int n, const std::function<void(int)>& f) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back(f, r);
  for (auto& t : th) t.join();
}

// The K3 / K3.1 tiny checkpoint read as a model with 4 KDA heads of width 8 instead of 2 of 16: the
// [H*K, .] projections, conv taps and dt_bias keep their shapes; A_log's zero tail supplies the extra
// heads' entries; b_proj [4, D] and o_norm [8] are views of existing tensors. A different but valid model.
class RegroupedKda : public Checkpoint {
 public:
  explicit RegroupedKda(const Checkpoint& base) : base_(base), cfg_(base.config()) {
    cfg_.kda.n_head *= 2;
    cfg_.kda.d_head /= 2;
    for (int l = 0; l < cfg_.n_layer; ++l) {
      if (cfg_.layer_attn[size_t(l)] != AttnKind::kda) continue;
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      TensorView b = *base.find(p + "q_proj.weight");  // [H*K, D] bf16: its first 4 rows
      b.shape = {cfg_.kda.n_head, b.dim(1)};
      b.nbytes = size_t(b.dim(0) * b.dim(1)) * dtype_size(b.dtype);
      TensorView o = *base.find(p + "o_norm.weight");
      o.shape = {cfg_.kda.d_head};
      o.nbytes = size_t(cfg_.kda.d_head) * dtype_size(o.dtype);
      replaced_[p + "b_proj.weight"] = b;
      replaced_[p + "o_norm.weight"] = o;
    }
  }
  const ModelConfig& config() const override { return cfg_; }
  const std::string& dir() const override { return base_.dir(); }
  const TensorView* find(std::string_view name) const override {
    auto it = replaced_.find(std::string(name));
    return it != replaced_.end() ? &it->second : base_.find(name);
  }
  std::vector<std::string> names() const override { return base_.names(); }

 private:
  const Checkpoint& base_;
  ModelConfig cfg_;
  std::map<std::string, TensorView> replaced_;
};

}  // namespace k3::disttest
