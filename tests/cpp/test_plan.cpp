// test_plan.cpp: the planner (dist/plan.h) against what the loader and the engine really hold, and against
// the sizes MODEL.md / ANCHORS.md derive for the real K3 (docs/configs/*.json).
#include <gtest/gtest.h>

#include <string>

#include "dist/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/model.h"

namespace k3 {
namespace {

const std::string kRoot = K3_SOURCE_DIR;

ModelConfig config_file(const std::string& name) {
  auto r = load_hf_config(kRoot + "/docs/configs/" + name);
  EXPECT_TRUE(r.ok()) << r.status().message();
  ModelConfig c = *r;
  c.kda.gate_rank = 128;  // MODEL.md §4: f_a_proj [128, D]
  return c;
}

int64_t bytes_of(const std::vector<PlanTensor>& w, Shard s) {
  int64_t n = 0;
  for (const PlanTensor& t : w) n += t.shard == s ? t.bytes : 0;
  return n;
}

class PlanCheckpoint : public ::testing::TestWithParam<const char*> {};

// Planner bytes = the bytes of every tensor the checkpoint holds, tensor by tensor.
TEST_P(PlanCheckpoint, WeightBytesEqualTheCheckpointTensors) {
  auto ck = Checkpoint::open(kRoot + "/models/" + GetParam());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const ModelConfig& c = (*ck)->config();
  const auto w = plan_tensors(c, [&](const std::string& n) { return (*ck)->find(n); });
  ASSERT_EQ(w.size(), (*ck)->names().size());
  int64_t planned = 0, stored = 0;
  for (const PlanTensor& t : w) {
    const TensorView* v = (*ck)->find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(t.bytes, int64_t(v->nbytes)) << t.name;
    EXPECT_EQ(t.dtype, v->dtype) << t.name;
    planned += t.bytes;
  }
  for (const std::string& n : (*ck)->names()) stored += int64_t((*ck)->find(n)->nbytes);
  EXPECT_EQ(planned, stored);
  // One GPU holds everything; EP over every expert divides the routed bytes exactly.
  PlanOptions o;
  o.context = 64;
  const Plan one = evaluate_plan(c, w, Layout{}, o);
  EXPECT_EQ(one.mem.weights(), stored);
  if (c.moe.n_expert % 2 == 0) {
    const Plan ep2 = evaluate_plan(c, w, Layout{1, 1, 2, 2}, o);
    EXPECT_EQ(ep2.mem.weights_ep * 2, bytes_of(w, Shard::ep));
  }
}

// Per-sequence state: the fp32 format is what SeqState allocates after n tokens; bf16 is k3 info's numbers.
TEST_P(PlanCheckpoint, StateBytesEqualSeqState) {
  auto ck = Checkpoint::open(kRoot + "/models/" + GetParam());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const ModelConfig& c = (*ck)->config();
  auto model = Model::load(**ck, ModelOptions{});
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto st = (*model)->new_state();
  const SeqCacheBytes f32 = seq_cache_bytes(c, CacheFormat::fp32, false);
  EXPECT_EQ(st->bytes(), f32.at(0));
  const std::vector<int32_t> tokens = {5, 17, 3, 99, 42, 7, 1};
  std::vector<float> logits;
  ASSERT_TRUE((*model)->forward(*st, tokens.data(), int64_t(tokens.size()), &logits, false).ok());
  EXPECT_EQ(st->bytes(), f32.at(int64_t(tokens.size())));
  EXPECT_GT(f32.mla_per_token, 0);

  const SeqCacheBytes b = seq_cache_bytes(c, CacheFormat::bf16, false);
  const int n_kda = c.n_layers_of(AttnKind::kda), n_dsa = c.n_layers_of(AttnKind::dsa);
  EXPECT_EQ(b.kda_state, n_kda * c.kda_state_bytes_per_layer());
  EXPECT_EQ(b.mla_per_token, (c.n_layers_of(AttnKind::mla) + n_dsa) * c.mla_bytes_per_token_per_layer());
  EXPECT_EQ(b.dsa_per_token, n_dsa * c.dsa_index_bytes_per_token_per_layer());
}

INSTANTIATE_TEST_SUITE_P(Models, PlanCheckpoint,
                         ::testing::Values("tiny-kl", "tiny-k3", "tiny-k31", "k3-tiny"));

// Real K3: experts = 92 MoE layers x 896 x one MXFP4 expert (MODEL.md §9 shapes); the bf16 trunk without
// the embedding and the head is "about 109 GB" (ANCHORS §0).
TEST(PlanK3, WeightTotalsMatchModelMd) {
  const ModelConfig c = config_file("kimi-k3.json");
  const auto w = plan_tensors(c, {});
  const int64_t expert = 2 * (3072 * 1792 + 3072 * 112) + (3584 * 1536 + 3584 * 96);  // w1, w3 + w2
  EXPECT_EQ(expert, 17547264);
  EXPECT_EQ(bytes_of(w, Shard::ep), int64_t(92) * 896 * expert);  // 1.446 TB
  const int64_t trunk = bytes_of(w, Shard::tp) + bytes_of(w, Shard::replicated);
  const int64_t table = int64_t(163840) * 7168 * 2;  // embed_tokens, lm_head [V, D] bf16
  EXPECT_GT(trunk - 2 * table, 108e9);
  EXPECT_LT(trunk - 2 * table, 110e9);
}

// MODEL.md §4, §6: 449 MB of KDA state per sequence; 27 GiB of latent per 1M tokens (33 GiB with the
// K3.1 index, 18.5 GiB in FP8).
TEST(PlanK3, CacheBytesMatchModelMd) {
  const ModelConfig k3 = config_file("kimi-k3.json"), k31 = config_file("kimi-k3.1-pro.json");
  const SeqCacheBytes a = seq_cache_bytes(k3, CacheFormat::bf16, false);
  EXPECT_NEAR(double(a.kda_state), 449e6, 1e6);
  const double gib = double(int64_t(1) << 30), M = double(int64_t(1) << 20);
  EXPECT_NEAR(double(a.mla_per_token) * M / gib, 27.0, 0.01);
  const SeqCacheBytes b = seq_cache_bytes(k31, CacheFormat::bf16, false);
  EXPECT_NEAR(double(b.mla_per_token + b.dsa_per_token) * M / gib, 33.0, 0.01);
  const SeqCacheBytes f8 = seq_cache_bytes(k31, CacheFormat::fp8, false);
  EXPECT_EQ(f8.mla_per_token / 24, 656);
  EXPECT_EQ(f8.dsa_per_token / 24, 132);
  EXPECT_NEAR(double(f8.mla_per_token + f8.dsa_per_token) * M / gib, 18.5, 0.05);
  // bf16 S (a vLLM option) halves S only: 69 x (96 x 128 x 128 x 2 + conv 3 x 96 x 128 x 3 x 2).
  EXPECT_EQ(seq_cache_bytes(k3, CacheFormat::bf16, true).kda_state,
            69 * (int64_t(96) * 128 * 128 * 2 + int64_t(3) * 96 * 128 * 3 * 2));
}

// K3 needs two nodes of 8 H200s: EP8 puts 181 GB of experts on a GPU; TP8 x EP16 fits.
TEST(PlanK3, SmallestLayoutIsTwoNodes) {
  const ModelConfig c = config_file("kimi-k3.json");
  const auto w = plan_tensors(c, {});
  PlanOptions o;
  o.nodes = 4;
  o.context = 131072;
  const Plan tp8 = evaluate_plan(c, w, Layout{8, 1, 1, 8}, o);
  EXPECT_FALSE(tp8.fits);
  EXPECT_NEAR(double(tp8.mem.weights_ep), 92.0 * 112 * 17547264, 1.0);
  const Plan p16 = evaluate_plan(c, w, Layout{8, 1, 2, 16}, o);
  EXPECT_TRUE(p16.fits) << p16.mem.total();
  EXPECT_EQ(p16.mem.weights_ep, int64_t(92) * 56 * 17547264);
  // Batch 1 decode reads 16 experts per MoE layer: 92 x 16 x 17.5 MB = 25.8 GB (ANCHORS §5, §0).
  // The embedding is a gather: one row [7168] bf16 per token instead of the table.
  const double trunk_read =
      double(bytes_of(w, Shard::tp) + bytes_of(w, Shard::replicated)) - 163840.0 * 7168 * 2 + 7168.0 * 2;
  EXPECT_NEAR(p16.decode.weight_bytes_per_token - trunk_read, 92.0 * 16 * 17547264, 1e3);
  const auto best = smallest_fit(all_plans(c, w, o));
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->layout.world(), 16);
  EXPECT_EQ(best->layout.ep, 16);
  EXPECT_TRUE(best->fits);
  o.nodes = 1;
  EXPECT_FALSE(smallest_fit(all_plans(c, w, o)).has_value());
}

// K3.1 under TP (src/dist/tp.h): the indexer's head-indexed wq_b / weights_proj split over the TP ranks,
// its per-token key path (wk, k_norm) stays whole; each DSA layer all-reduces fp32 score rows of n_ctx.
TEST(PlanK31, IndexerHeadsSplitOverTp) {
  const ModelConfig c = config_file("kimi-k3.1-pro.json");
  ASSERT_TRUE(c.dsa.enabled);
  const auto w = plan_tensors(c, {});
  int64_t split = 0, whole = 0, n_split = 0, n_whole = 0;
  for (const PlanTensor& t : w) {
    if (t.name.find(".indexer.") == std::string::npos) continue;
    const bool head =
        t.name.find(".wq_b.") != std::string::npos || t.name.find(".weights_proj.") != std::string::npos;
    EXPECT_EQ(t.shard, head ? Shard::tp : Shard::replicated) << t.name;
    (head ? split : whole) += t.bytes;
    ++(head ? n_split : n_whole);
  }
  const int64_t n_dsa = c.n_layers_of(AttnKind::dsa), Hi = c.dsa.n_head, Di = c.dsa.d_head;
  EXPECT_EQ(n_split, 2 * n_dsa);
  EXPECT_EQ(n_whole, 3 * n_dsa);  // wk, k_norm weight and bias
  const int64_t es = int64_t(dtype_size(w.front().dtype));
  EXPECT_EQ(split, n_dsa * (Hi * Di * c.mla.q_lora_rank + Hi * c.d_model) * es);
  PlanOptions o;
  o.nodes = 2;
  o.context = 131072;
  o.batch = 4;
  const Plan tp1 = evaluate_plan(c, w, Layout{1, 1, 16, 16}, o),
             tp8 = evaluate_plan(c, w, Layout{8, 1, 2, 16}, o);
  EXPECT_EQ(tp1.comm.tp_dsa_decode, 0.0);
  // 2 (n-1)/n ring factor x 2 sequences per replica x one fp32 row of 131072 scores.
  EXPECT_DOUBLE_EQ(tp8.comm.tp_dsa_decode, 2.0 * 7 / 8 * 2 * 131072 * 4);
  EXPECT_DOUBLE_EQ(tp8.comm.tp_dsa_prefill_per_token, 2.0 * 7 / 8 * 131072 * 4);
  // The split indexer weights count 1/8 per rank: TP8's TP bytes fall by 7/8 of them (and of the rest).
  EXPECT_NEAR(double(tp1.mem.weights_tp - tp8.mem.weights_tp), double(bytes_of(w, Shard::tp)) * 7 / 8, 1e3);
}

// Kimi-Linear-48B (bf16, ~49 B weights = ~98 GB): one H200 at 8K context.
TEST(PlanKL, FitsOneGpu) {
  const ModelConfig c = config_file("kimi-linear-48b-a3b.json");
  const auto w = plan_tensors(c, {});
  int64_t total = 0;
  for (const PlanTensor& t : w) total += t.bytes;
  EXPECT_GT(total, 90e9);
  EXPECT_LT(total, 105e9);
  PlanOptions o;
  o.context = 8192;
  const auto best = smallest_fit(all_plans(c, w, o));
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->layout.world(), 1);
}

TEST(PlanLayout, ParseAndCheck) {
  auto l = parse_layout("TP8xEP16");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->tp, 8);
  EXPECT_EQ(l->ep, 16);
  EXPECT_EQ(l->world(), 8);  // no kcp/dp given: world 8, ep 16 does not divide it
  l = parse_layout("tp=8, kcp=2, ep=16");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->world(), 16);
  EXPECT_EQ(l->name(), "TP8xKCP2xEP16");
  EXPECT_EQ(parse_layout("tp4")->ep, 4);
  EXPECT_FALSE(parse_layout("tq8").ok());
  EXPECT_FALSE(parse_layout("tp0").ok());
  EXPECT_FALSE(parse_layout("tp").ok());

  const ModelConfig c = config_file("kimi-k3.json");
  PlanOptions o;
  o.nodes = 2;
  EXPECT_TRUE(check_layout(c, Layout{8, 2, 1, 16}, o).ok());
  EXPECT_FALSE(check_layout(c, Layout{8, 1, 1, 16}, o).ok());   // ep > world
  EXPECT_FALSE(check_layout(c, Layout{16, 1, 1, 16}, o).ok());  // tp across nodes
  EXPECT_FALSE(check_layout(c, Layout{5, 1, 1, 5}, o).ok());    // 96 heads
  EXPECT_FALSE(check_layout(c, Layout{8, 4, 1, 32}, o).ok());   // 32 GPUs > 2 nodes
  EXPECT_FALSE(check_layout(c, Layout{1, 1, 3, 3}, o).ok());    // 896 experts, and not whole node
}

}  // namespace
}  // namespace k3
