// test_dist_tp.cpp: tensor and expert parallelism with in-process ranks give the single-rank logits.
//
// For tiny-kl, tiny-k3, tiny-k31 (and the K3 models read with 4 KDA heads, so TP = 4 divides every head
// count): TP = 2, 4 where tp_check allows it, EP = 2, 4 (round robin and load-balanced placement),
// TP = 2 x EP = 2 on the same ranks, and two TP = 2 groups under one EP = 4 group. fp32 mode: a prefill
// (every row's logits) then two decoded tokens (absorbed MLA, recurrent KDA), NMSE <= 1e-6 against one rank;
// every rank ends with bit-identical logits (replicated activations). DsaIndexerHeadsSplit: the K3.1 index
// sets under TP equal the single rank's on every rank.
#include <gtest/gtest.h>

#include "dist/ep.h"
#include "dist/shard.h"
#include "dist/tp.h"
#include "model/weights.h"
#include "test_dist_util.h"

namespace k3 {
namespace {

using namespace disttest;

std::vector<float> single_rank(const Checkpoint& ck, const std::vector<int32_t>& tok,
                               Precision prec = Precision::fp32) {
  ModelOptions opt = test_options();
  opt.precision = prec;
  auto m = Model::load(ck, opt);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  auto st = (*m)->new_state();
  std::vector<float> logits, step;
  EXPECT_TRUE((*m)->forward(*st, tok.data(), int64_t(tok.size()) - 2, &logits, true).ok());
  for (size_t t = tok.size() - 2; t < tok.size(); ++t) {  // decode: absorbed MLA, recurrent KDA
    EXPECT_TRUE((*m)->forward(*st, &tok[t], 1, &step, false).ok());
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

// n = max(tp, ep) ranks; tp divides n (TP groups of consecutive ranks), ep in {1, n}. Returns rank 0's logits
// after checking every rank got the same bits.
std::vector<float> sharded(const Checkpoint& ck, int tp, int ep, const std::vector<int32_t>& tok,
                           std::span<const double> load = {}, Precision prec = Precision::fp32) {
  const int n = std::max(tp, ep);
  auto comms = make_inproc_comms(n);
  // TP groups of `tp` consecutive ranks, each its own communicator, when EP spans more ranks than TP.
  std::vector<std::vector<std::unique_ptr<Comm>>> tp_groups;
  for (int g = 0; tp < n && g < n / tp; ++g) tp_groups.push_back(make_inproc_comms(tp));
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  std::vector<std::string> err(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    ShardPlan plan;
    if (tp > 1) plan.tp = tp < n ? tp_groups[size_t(r / tp)][size_t(r % tp)].get() : comms[size_t(r)].get();
    if (ep > 1) {
      plan.ep = comms[size_t(r)].get();
      plan.owner = ep_placement(ck.config().moe.n_expert, ep, load);
    }
    ShardHooks hooks(plan);
    ModelOptions opt = test_options();
    opt.precision = prec;
    opt.parallel = &hooks;
    auto m = Model::load(ck, opt, shard_transform(plan));
    if (!m.ok()) {
      err[size_t(r)] = m.status().message();
      return;
    }
    if (tp > 1 && (*m)->config().kda.n_head * tp != ck.config().kda.n_head)
      err[size_t(r)] = "KDA heads not sharded";
    auto st = (*m)->new_state();
    std::vector<float> step;
    Status s = (*m)->forward(*st, tok.data(), int64_t(tok.size()) - 2, &out[size_t(r)], true);
    for (size_t t = tok.size() - 2; s.ok() && t < tok.size(); ++t) {
      s = (*m)->forward(*st, &tok[t], 1, &step, false);
      out[size_t(r)].insert(out[size_t(r)].end(), step.begin(), step.end());
    }
    if (!s.ok()) err[size_t(r)] = s.message();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(err[size_t(r)].empty()) << "rank " << r << ": " << err[size_t(r)];
    EXPECT_TRUE(out[size_t(r)] == out[0]) << "rank " << r << " differs from rank 0";
  }
  return out[0];
}

void check_model(const Checkpoint& ck, const char* name) {
  const auto tok = random_tokens(37, ck.config().n_vocab, 11);
  const std::vector<float> ref = single_rank(ck, tok);
  ASSERT_FALSE(ref.empty());
  auto expect = [&](double e, const std::string& what) {
    std::printf("%s %s: NMSE %.3g\n", name, what.c_str(), e);
    EXPECT_LE(e, 1e-6) << name << " " << what;
  };
  int tested_tp = 0;
  for (int tp : {2, 4}) {
    if (!tp_check(ck.config(), tp).ok()) continue;
    ++tested_tp;
    expect(nmse(sharded(ck, tp, 1, tok), ref), "TP=" + std::to_string(tp));
  }
  EXPECT_GT(tested_tp, 0) << name;
  for (int ep : {2, 4}) expect(nmse(sharded(ck, 1, ep, tok), ref), "EP=" + std::to_string(ep));
  const std::vector<double> load = {5, 1, 9, 2, 7, 3, 8, 4};
  if (ck.config().moe.n_expert == 8) expect(nmse(sharded(ck, 1, 4, tok, load), ref), "EP=4 balanced");
  if (tp_check(ck.config(), 2).ok()) {
    expect(nmse(sharded(ck, 2, 2, tok), ref), "TP=2 x EP=2");
    expect(nmse(sharded(ck, 2, 4, tok), ref), "TP=2 (two groups) x EP=4");
  }
}

TEST(DistTp, TinyKl) {
  auto ck = open_tiny("tiny-kl");
  ASSERT_TRUE(ck);
  check_model(*ck, "tiny-kl");
}

TEST(DistTp, TinyK3) {
  auto ck = open_tiny("tiny-k3");
  ASSERT_TRUE(ck);
  check_model(*ck, "tiny-k3");
  RegroupedKda h4(*ck);
  ASSERT_TRUE(tp_check(h4.config(), 4).ok());
  check_model(h4, "tiny-k3 (4 KDA heads)");
}

TEST(DistTp, TinyK31) {
  auto ck = open_tiny("tiny-k31");
  ASSERT_TRUE(ck);
  check_model(*ck, "tiny-k31");
  RegroupedKda h4(*ck);
  ASSERT_TRUE(tp_check(h4.config(), 4).ok());
  check_model(h4, "tiny-k31 (4 KDA heads)");
}

// The DSA indexer's heads are split under TP (tp.h): every rank sums its heads' ReLU-weighted scores, the
// partial score rows are summed over ranks (reduce_index_scores), and the top-k runs on every rank. One
// prefill then two decoded tokens, with the trace "dsa_sel" (every DSA layer's selected positions) recorded.
struct SelRun {
  std::vector<float> logits, sel;
  int64_t index_heads = 0;  // sum over DSA layers of this rank's index heads (weights_proj rows)
};

SelRun run_with_sel(const Checkpoint& ck, const std::vector<int32_t>& tok, ParallelHooks* hooks,
                    const WeightTransform& shard) {
  SelRun out;
  ModelOptions opt = test_options();
  opt.parallel = hooks;
  opt.trace = [&](const char* name, int, const float* x, int64_t n) {
    if (std::string(name) == "dsa_sel") out.sel.insert(out.sel.end(), x, x + n);
  };
  auto m = Model::load(ck, opt, [&](ModelConfig& cfg, ModelWeights& w) -> Status {
    if (shard) K3_RETURN_IF_ERROR(shard(cfg, w));
    for (const LayerWeights& lw : w.layers)
      if (lw.kind != AttnKind::kda && lw.mla.has_dsa) out.index_heads += lw.mla.dsa.weights_proj.out;
    return ok_status();
  });
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return out;
  auto st = (*m)->new_state();
  std::vector<float> step;
  Status s = (*m)->forward(*st, tok.data(), int64_t(tok.size()) - 2, &out.logits, true);
  for (size_t t = tok.size() - 2; s.ok() && t < tok.size(); ++t) {
    s = (*m)->forward(*st, &tok[t], 1, &step, false);
    out.logits.insert(out.logits.end(), step.begin(), step.end());
  }
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

void check_index_sets(const Checkpoint& ck, const char* name, int tp) {
  const ModelConfig& cfg = ck.config();
  ASSERT_TRUE(cfg.dsa.enabled) << name;
  const auto tok = random_tokens(37, cfg.n_vocab, 11);
  const SelRun one = run_with_sel(ck, tok, nullptr, {});
  // The sets must really be sparse (more visible positions than topk), else the test checks nothing.
  int64_t sparse_rows = 0;
  for (size_t i = 0; i + size_t(cfg.dsa.topk) <= one.sel.size(); i += size_t(cfg.dsa.topk))
    sparse_rows += one.sel[i + size_t(cfg.dsa.topk) - 1] > float(cfg.dsa.topk - 1);
  ASSERT_GT(sparse_rows, 0) << name;
  auto comms = make_inproc_comms(tp);
  std::vector<SelRun> r(static_cast<size_t>(tp));
  run_ranks(tp, [&](int k) {
    ShardPlan plan;
    plan.tp = comms[size_t(k)].get();
    ShardHooks hooks(plan);
    r[size_t(k)] = run_with_sel(ck, tok, &hooks, shard_transform(plan));
  });
  int64_t heads = 0;
  for (int k = 0; k < tp; ++k) {
    const SelRun& x = r[size_t(k)];
    heads += x.index_heads;
    EXPECT_LT(x.index_heads, one.index_heads) << name << " rank " << k << ": index heads not split";
    EXPECT_TRUE(x.sel == one.sel) << name << " TP=" << tp << " rank " << k << ": index sets differ";
    EXPECT_TRUE(x.logits == r[0].logits) << name << " rank " << k << " differs from rank 0";
    const double e = nmse(x.logits, one.logits);
    EXPECT_LE(e, 1e-6) << name << " TP=" << tp << " rank " << k;
    if (k == 0)
      std::printf("%s TP=%d, index heads split: NMSE %.3g, %lld sparse index rows\n", name, tp, e,
                  static_cast<long long>(sparse_rows));
  }
  EXPECT_EQ(heads, one.index_heads) << name;
}

TEST(DistTp, DsaIndexerHeadsSplit) {
  auto ck = open_tiny("tiny-k31");
  ASSERT_TRUE(ck);
  check_index_sets(*ck, "tiny-k31", 2);
  RegroupedKda h4(*ck);  // 2 index heads over 4 ranks: two ranks hold one head, two hold none
  check_index_sets(h4, "tiny-k31 (4 KDA heads)", 4);
}

// bf16 mode rounds after the reduce, so TP differs from one rank only by fp32 summation order (a rounding
// flip now and then); EP forms the same expert batches.
TEST(DistTp, Bf16StaysClose) {
  auto ck = open_tiny("tiny-k31");
  ASSERT_TRUE(ck);
  const auto tok = random_tokens(37, ck->config().n_vocab, 11);
  const std::vector<float> ref = single_rank(*ck, tok, Precision::bf16);
  const double tp = nmse(sharded(*ck, 2, 1, tok, {}, Precision::bf16), ref);
  const double ep = nmse(sharded(*ck, 1, 4, tok, {}, Precision::bf16), ref);
  std::printf("bf16 NMSE vs one rank: TP=2 %.3g, EP=4 %.3g\n", tp, ep);
  EXPECT_LE(tp, 1e-3);
  EXPECT_LE(ep, 1e-6);
}

TEST(DistTp, RejectsDegreesThatDoNotDivide) {
  auto ck = open_tiny("tiny-kl");
  ASSERT_TRUE(ck);
  Status s = tp_check(ck->config(), 3);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not divide"), std::string::npos) << s.message();
  auto m =
      Model::load(*ck, test_options(), [](ModelConfig& c, ModelWeights& w) { return tp_shard(c, w, 0, 3); });
  EXPECT_FALSE(m.ok());
}

}  // namespace
}  // namespace k3
