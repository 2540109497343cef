// patched_checkpoint.h: a tiny checkpoint with its config.json changed in memory (tests only).
//
// PatchedCheckpoint::make("tiny-k3", patch) opens models/<base>, applies `patch` to the parsed config.json
// and serves every tensor the new config expects (io/manifest.h): the base's own where its shape still fits
// (a 0 in an expected shape is a size the config leaves open), else a fresh one drawn the way
// scripts/make_tiny_checkpoints.py draws it (KDA conv, gate and norm laws; N(0, 1/fan_in) for the rest).
// fresh_ lists the drawn names. Used to reach shapes no tiny checkpoint has (KDA heads of 128, DSA over a
// 512-wide MLA latent) without a new file in models/.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/manifest.h"

namespace k3::testutil {

class PatchedCheckpoint : public Checkpoint {
 public:
  static std::unique_ptr<PatchedCheckpoint> make(const std::string& base_name,
                                                 const std::function<void(nlohmann::json&)>& patch) {
    const std::string dir = std::string(K3_SOURCE_DIR) + "/models/" + base_name;
    auto base = Checkpoint::open(dir);
    EXPECT_TRUE(base.ok()) << base.status().message();
    if (!base.ok()) return nullptr;
    std::ifstream f(dir + "/config.json");
    nlohmann::json j = nlohmann::json::parse(f);
    patch(j);
    auto cfg = parse_hf_config(j.dump());
    EXPECT_TRUE(cfg.ok()) << cfg.status().message();
    if (!cfg.ok()) return nullptr;
    std::unique_ptr<PatchedCheckpoint> c(new PatchedCheckpoint);
    c->base_ = std::move(base).value();
    c->cfg_ = std::move(cfg).value();
    c->fill();
    return c;
  }
  const ModelConfig& config() const override { return cfg_; }
  const std::string& dir() const override { return dir_; }
  const TensorView* find(std::string_view name) const override {
    auto it = t_.find(std::string(name));
    return it == t_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : t_) n.push_back(k);
    return n;
  }

 private:
  void fill() {
    std::mt19937 rng(1234);
    std::normal_distribution<float> N(0.f, 1.f);
    std::uniform_real_distribution<float> U(0.f, 1.f);
    const bool k3 = cfg_.kda.has_gate_lower_bound;
    const int64_t H = cfg_.kda.n_head;
    const auto has = [&](const std::string& n) { return base_->find(n) != nullptr; };
    for (const ExpectedTensor& e : expected_tensors(cfg_, has)) {
      const TensorView* b = base_->find(e.name);
      // a 0 in an expected shape is a size the config leaves to the checkpoint (the gate's low rank)
      const auto fits = [&](const std::vector<int64_t>& want) {
        if (!b || b->shape.size() != want.size()) return false;
        for (size_t i = 0; i < want.size(); ++i)
          if (want[i] != 0 && want[i] != b->shape[i]) return false;
        return true;
      };
      if (std::any_of(e.shapes.begin(), e.shapes.end(), fits)) {
        t_[e.name] = *b;  // any allowed shape (MXFP4 experts are stored packed, not as shapes[0])
        continue;
      }
      fresh_.push_back(e.name);
      std::vector<int64_t> shape = e.shapes[0];
      for (size_t i = 0; i < shape.size(); ++i)  // an open size keeps the base's (f_b_proj: [HK, rank])
        if (shape[i] == 0 && b && b->shape.size() == shape.size()) shape[i] = b->shape[i];
      TensorView v;
      v.shape = shape;
      v.dtype = b ? b->dtype : e.dtypes[0];
      const int64_t n = v.numel(), fan_in = shape.back();
      std::vector<float> x(static_cast<size_t>(n));
      const std::string& nm = e.name;
      auto ends = [&](const char* s) { return nm.size() >= std::strlen(s) && nm.ends_with(s); };
      for (int64_t i = 0; i < n; ++i) {
        if (ends("conv1d.weight")) {
          x[size_t(i)] = 0.5f * N(rng);
        } else if (ends("dt_bias")) {  // K3: g = -5 sigmoid(.) in about (-2.5, -0.2); KL: dt in (1e-3, 1e-1)
          const float dt = std::exp(std::log(1e-3f) + U(rng) * std::log(100.f));
          x[size_t(i)] = k3 ? -3.f * U(rng) : dt + std::log(-std::expm1(-dt));
        } else if (ends("A_log")) {
          x[size_t(i)] = i < H ? (k3 ? std::log(0.5f + 1.5f * U(rng)) : std::log(1.f + 15.f * U(rng))) : 0.f;
        } else if (ends("norm.weight")) {
          x[size_t(i)] = 1.f + 0.1f * N(rng);
        } else {  // [out, in] linear
          x[size_t(i)] = N(rng) / std::sqrt(float(fan_in)) * (ends("f_b_proj.weight") ? 0.5f : 1.f);
        }
      }
      std::vector<uint8_t>& d = data_.emplace_back();
      if (v.dtype == DType::bf16) {
        d.resize(size_t(n) * 2);
        auto* p = reinterpret_cast<uint16_t*>(d.data());
        for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(x[size_t(i)]);
      } else {
        EXPECT_EQ(v.dtype, DType::f32) << nm;
        d.resize(size_t(n) * 4);
        std::memcpy(d.data(), x.data(), d.size());
      }
      v.data = d.data(), v.nbytes = d.size();
      t_[e.name] = v;
    }
  }
  std::unique_ptr<Checkpoint> base_;
 public:
  std::vector<std::string> fresh_;  // the tensors drawn here (the base's shape no longer fits)
 private:
  ModelConfig cfg_;
  std::string dir_ = "<memory: patched>";
  std::map<std::string, TensorView> t_;
  std::vector<std::vector<uint8_t>> data_;
};

}  // namespace k3::testutil
