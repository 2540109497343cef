// test_model_paths.cpp: the model's execution paths agree on the tiny checkpoints (fp32 mode).
//
//   one-shot prefill == chunked prefill (1, 7, 64, 100) == token-by-token decode     NMSE <= 1e-6 on logits
//   absorbed MLA == unabsorbed MLA;  K3.1 with index_topk >= context == the same model as dense MLA
//   batch of 3 sequences == each alone;  a bad token id gives a Status and leaves the state alone
//   bf16 mode stays close to fp32 mode
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/model.h"
#include "model_test_util.h"

namespace k3 {
namespace {

// A Checkpoint whose config is edited (tensors shared with the wrapped one).
// A Checkpoint whose config is edited and one tensor may be replaced (the rest shared with the wrapped one).
class EditedCheckpoint : public Checkpoint {
 public:
  EditedCheckpoint(const Checkpoint& base, ModelConfig cfg) : base_(base), cfg_(std::move(cfg)) {}
  const ModelConfig& config() const override { return cfg_; }
  const std::string& dir() const override { return base_.dir(); }
  const TensorView* find(std::string_view name) const override {
    return name == replaced_name_ ? &replaced_ : base_.find(name);
  }
  std::vector<std::string> names() const override { return base_.names(); }
  void replace(const std::string& name, TensorView t) {
    replaced_name_ = name;
    replaced_ = std::move(t);
  }

 private:
  const Checkpoint& base_;
  ModelConfig cfg_;
  std::string replaced_name_;
  TensorView replaced_;
};

std::unique_ptr<Checkpoint> open_tiny(const std::string& name) {
  auto r = Checkpoint::open(std::string(K3_SOURCE_DIR) + "/models/" + name);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<Model> load(const Checkpoint& ck, ModelOptions opt = {}) {
  if (opt.n_threads == 0) opt.n_threads = 2;
  auto r = Model::load(ck, opt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

using testutil::nmse;
using testutil::random_tokens;

// All-position logits, fed `step` tokens per forward call (step <= 0: one shot).
std::vector<float> run(Model& m, const std::vector<int32_t>& tok, int64_t step) {
  auto st = m.new_state();
  const int64_t T = int64_t(tok.size());
  if (step <= 0) step = T;
  std::vector<float> all, part;
  for (int64_t t0 = 0; t0 < T; t0 += step) {
    const int64_t n = std::min(step, T - t0);
    Status s = m.forward(*st, tok.data() + t0, n, &part, true);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(part.size(), size_t(n * m.config().n_vocab));
    all.insert(all.end(), part.begin(), part.end());
  }
  EXPECT_EQ(st->n_past(), T);
  return all;
}

class ModelPaths : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelPaths, PrefillChunkedDecodeAgree) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  auto m = load(*ck);
  ASSERT_TRUE(m);
  const auto tok = random_tokens(130, m->config().n_vocab, 7);
  const auto ref = run(*m, tok, 0);
  double mean_abs = 0;
  for (float v : ref) {
    ASSERT_TRUE(std::isfinite(v));
    mean_abs += std::fabs(v);
  }
  EXPECT_GT(mean_abs / double(ref.size()), 1e-4);  // not a degenerate all-zero output
  for (int64_t step : {1, 7, 64, 100}) EXPECT_LE(nmse(run(*m, tok, step), ref), 1e-6) << "chunk " << step;
  ModelOptions rec;
  rec.kda_recurrent = true;
  auto mr = load(*ck, rec);
  EXPECT_LE(nmse(run(*mr, tok, 0), ref), 1e-6) << "forced recurrent KDA";
  ModelOptions small;
  small.kda_chunk = 5;
  auto ms = load(*ck, small);
  EXPECT_LE(nmse(run(*ms, tok, 0), ref), 1e-6) << "KDA chunk 5";
}

TEST_P(ModelPaths, AbsorbedEqualsUnabsorbed) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  ModelOptions a, u;
  a.mla = MlaPath::absorbed;
  u.mla = MlaPath::unabsorbed;
  auto ma = load(*ck, a), mu = load(*ck, u);
  ASSERT_TRUE(ma && mu);
  const auto tok = random_tokens(40, ma->config().n_vocab, 11);
  const auto ref = run(*mu, tok, 0);
  EXPECT_LE(nmse(run(*ma, tok, 0), ref), 1e-6);
  EXPECT_LE(nmse(run(*ma, tok, 1), ref), 1e-6);
  EXPECT_LE(nmse(run(*mu, tok, 1), ref), 1e-6);
}

TEST_P(ModelPaths, BatchEqualsAlone) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  auto m = load(*ck);
  ASSERT_TRUE(m);
  const int32_t V = m->config().n_vocab;
  std::vector<std::vector<int32_t>> seqs = {random_tokens(9, V, 1), random_tokens(1, V, 2),
                                            random_tokens(23, V, 3)};
  std::vector<std::unique_ptr<SeqState>> owned;
  std::vector<SeqState*> states;
  std::vector<std::span<const int32_t>> spans;
  for (auto& s : seqs) {
    owned.push_back(m->new_state());
    states.push_back(owned.back().get());
    spans.emplace_back(s);
  }
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(m->forward_batch(states, spans, &out).ok());
  // a second (decode) step for every sequence
  std::vector<std::vector<int32_t>> next = {{5}, {6}, {7}};
  std::vector<std::span<const int32_t>> spans2(next.begin(), next.end());
  std::vector<std::vector<float>> out2;
  ASSERT_TRUE(m->forward_batch(states, spans2, &out2).ok());
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto st = m->new_state();
    std::vector<float> alone, alone2;
    ASSERT_TRUE(m->forward(*st, seqs[i].data(), int64_t(seqs[i].size()), &alone, false).ok());
    ASSERT_TRUE(m->forward(*st, next[i].data(), 1, &alone2, false).ok());
    EXPECT_LE(nmse(out[i], alone), 1e-6) << "sequence " << i;
    EXPECT_LE(nmse(out2[i], alone2), 1e-6) << "sequence " << i << " decode";
  }
}

TEST_P(ModelPaths, BatchSkipsEmptySpansAndRejectsBadTokens) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  auto m = load(*ck);
  ASSERT_TRUE(m);
  auto a = m->new_state(), b = m->new_state();
  std::vector<SeqState*> states = {a.get(), b.get()};
  std::vector<int32_t> ta = {3, 4, 5}, tb;
  std::vector<std::span<const int32_t>> spans = {ta, tb};
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(m->forward_batch(states, spans, &out).ok());
  EXPECT_EQ(out[0].size(), size_t(m->config().n_vocab));
  EXPECT_TRUE(out[1].empty());
  EXPECT_EQ(b->n_past(), 0);
  std::vector<int32_t> bad = {1, -7};
  spans = {ta, bad};
  EXPECT_FALSE(m->forward_batch(states, spans, &out).ok());
  EXPECT_EQ(a->n_past(), 3);  // nothing ran
}

// The caller's logit vectors are reused across calls: an idle sequence's vector is emptied, a smaller batch
// shrinks the list, and the values equal a call into fresh vectors.
TEST_P(ModelPaths, BatchReusesTheCallersVectors) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  auto m = load(*ck);
  ASSERT_TRUE(m);
  const size_t V = size_t(m->config().n_vocab);
  auto a = m->new_state(), b = m->new_state(), a2 = m->new_state(), b2 = m->new_state();
  std::vector<int32_t> ta = {3, 4, 5}, tb = {6, 7}, none;
  std::vector<std::vector<float>> kept, fresh, fresh2, fresh3;
  std::vector<SeqState*> s1 = {a.get(), b.get()}, f1 = {a2.get(), b2.get()};
  std::vector<std::span<const int32_t>> spans = {ta, tb};
  ASSERT_TRUE(m->forward_batch(s1, spans, &kept).ok());
  ASSERT_TRUE(m->forward_batch(f1, spans, &fresh).ok());
  spans = {none, tb};  // a idle, b one more step
  ASSERT_TRUE(m->forward_batch(s1, spans, &kept).ok());
  ASSERT_TRUE(m->forward_batch(f1, spans, &fresh2).ok());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_TRUE(kept[0].empty());
  ASSERT_EQ(kept[1].size(), V);
  EXPECT_EQ(kept[1], fresh2[1]);
  std::vector<SeqState*> s2 = {a.get()}, f2 = {a2.get()};
  spans = {ta};
  ASSERT_TRUE(m->forward_batch(s2, spans, &kept).ok());
  ASSERT_TRUE(m->forward_batch(f2, spans, &fresh3).ok());
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0], fresh3[0]);
}

TEST_P(ModelPaths, BadTokenIsAStatus) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  auto m = load(*ck);
  ASSERT_TRUE(m);
  auto st = m->new_state();
  std::vector<int32_t> tok = {1, 2, m->config().n_vocab};
  std::vector<float> logits;
  Status s = m->forward(*st, tok.data(), 3, &logits, true);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::invalid_argument);
  EXPECT_EQ(st->n_past(), 0);
  tok = {-1};
  EXPECT_FALSE(m->forward(*st, tok.data(), 1, &logits, true).ok());
  tok = {1, 2};  // the state is still usable
  EXPECT_TRUE(m->forward(*st, tok.data(), 2, &logits, true).ok());
  EXPECT_EQ(st->n_past(), 2);
}

// bf16 mode: every named activation at a rounding point holds bf16 values, and the output moves away from
// fp32 mode. Path agreement is only loose here: the random tiny models amplify a single bf16 rounding flip
// (caused by a last-bit fp32 difference between chunkwise and recurrent KDA) to percent-level logit changes.
TEST_P(ModelPaths, Bf16RoundingPoints) {
  auto ck = open_tiny(GetParam());
  ASSERT_TRUE(ck);
  int64_t n_checked = 0, n_bad = 0;
  ModelOptions b;
  b.precision = Precision::bf16;
  b.trace = [&](const char* name, int, const float* x, int64_t n) {
    static const char* rounded[] = {"attn_norm", "attn_out",  "ffn_norm", "ffn_out",    "l_out",
                                    "kda_o",     "kda_gated", "mla_z",    "moe_routed", "result_norm"};
    for (const char* r : rounded)
      if (std::string(name) == r) {
        for (int64_t i = 0; i < n; ++i) n_bad += round_bf16(x[i]) != x[i];
        n_checked += n;
      }
  };
  auto m32 = load(*ck), m16 = load(*ck, b);
  ASSERT_TRUE(m32 && m16);
  const auto tok = random_tokens(70, m32->config().n_vocab, 5);
  const auto lo = run(*m16, tok, 0);
  EXPECT_GT(n_checked, 10000);
  EXPECT_EQ(n_bad, 0);
  const double e = nmse(lo, run(*m32, tok, 0));
  EXPECT_GT(e, 1e-8);
  EXPECT_LT(e, 1.0);
  EXPECT_LE(nmse(run(*m16, tok, 7), lo), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelPaths, ::testing::Values("tiny-kl", "tiny-k3", "tiny-k31"),
                         [](const auto& info) { return std::string(info.param).substr(5); });

TEST(ModelPathsDsa, FullTopkEqualsDenseMla) {
  auto ck = open_tiny("tiny-k31");
  ASSERT_TRUE(ck);
  ASSERT_EQ(ck->config().family, Family::k3_1);
  const int64_t T = 40;
  ModelConfig wide = ck->config();
  wide.dsa.topk = int(T);
  ModelConfig dense = ck->config();
  for (auto& k : dense.layer_attn)
    if (k == AttnKind::dsa) k = AttnKind::mla;
  dense.dsa = DsaConfig{};
  EditedCheckpoint ck_wide(*ck, wide), ck_dense(*ck, dense);
  auto mw = load(ck_wide), md = load(ck_dense), ms = load(*ck);
  ASSERT_TRUE(mw && md && ms);
  const auto tok = random_tokens(T, mw->config().n_vocab, 3);
  const auto ref = run(*md, tok, 0);
  EXPECT_LE(nmse(run(*mw, tok, 0), ref), 1e-6);
  EXPECT_LE(nmse(run(*mw, tok, 1), ref), 1e-6);
  // The released top-k (below the context) really selects: the logits move away from dense.
  ASSERT_LT(ck->config().dsa.topk, T);
  EXPECT_GT(nmse(run(*ms, tok, 0), ref), 1e-8);
}

// Debug builds check every traced activation: a NaN norm gain in layer 2 is reported with layer and name.
TEST(ModelPathsGuard, NonFiniteActivationIsReported) {
  if (!Model::activation_checks_enabled())
    GTEST_SKIP() << "the NaN/Inf guard is compiled in debug builds only";
  auto ck = open_tiny("tiny-kl");
  ASSERT_TRUE(ck);
  const int64_t D = ck->config().d_model;
  std::vector<float> gain(size_t(D), 1.f);
  gain[3] = std::nanf("");
  TensorView t;
  t.dtype = DType::f32;
  t.shape = {D};
  t.data = gain.data();
  t.nbytes = size_t(D) * 4;
  EditedCheckpoint poisoned(*ck, ck->config());
  poisoned.replace("model.layers.2.input_layernorm.weight", t);
  auto m = load(poisoned);
  ASSERT_TRUE(m);
  auto st = m->new_state();
  std::vector<int32_t> tok = {1, 2, 3};
  std::vector<float> logits;
  Status s = m->forward(*st, tok.data(), 3, &logits, true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("attn_norm"), std::string::npos) << s.message();
}

TEST(ModelPathsTrace, NamedIntermediates) {
  auto ck = open_tiny("tiny-k3");
  ASSERT_TRUE(ck);
  std::vector<std::pair<std::string, int>> seen;
  ModelOptions opt;
  opt.trace = [&](const char* name, int layer, const float*, int64_t) { seen.emplace_back(name, layer); };
  auto m = load(*ck, opt);
  ASSERT_TRUE(m);
  const auto tok = random_tokens(4, m->config().n_vocab, 9);
  run(*m, tok, 0);
  auto has = [&](const char* n, int l) {
    return std::find(seen.begin(), seen.end(), std::pair<std::string, int>(n, l)) != seen.end();
  };
  EXPECT_TRUE(has("attn_norm", 0));
  EXPECT_TRUE(has("kda_o", 0));
  EXPECT_TRUE(has("mla_z", 3));
  EXPECT_TRUE(has("moe_routed", 1));
  EXPECT_TRUE(has("l_out", m->config().n_layer - 1));
  EXPECT_TRUE(has("result_norm", m->config().n_layer));
}

}  // namespace
}  // namespace k3
