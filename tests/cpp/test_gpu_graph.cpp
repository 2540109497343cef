// test_gpu_graph.cpp: CUDA-graph decode steps (gpu/model_gpu.h set_cuda_graph, gpu/step_graph.cuh) give the
// eager run's logits bit for bit.
//
//   Two sets of sequences with the same prompts; every decode step runs once eagerly (graphs off) on the
//   first set and once with graphs on the second, then both get the same next tokens. Batch sizes 1, 3, 5
//   and 8 (3 and 5 are padded to the buckets 4 and 8 with scratch sequences), fp32 and bf16, the three tiny
//   families (tiny-k31 runs past index_topk so DSA is sparse); then a batch whose membership changes (a
//   sequence leaves: the graphs are captured again), a synthetic context (fill_synthetic), and the option.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "gpu/model_gpu.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "gpu_test_util.h"
#include "model_test_util.h"

namespace k3 {
namespace {


using testutil::random_tokens;

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<gpu::GpuModel> m;
};

Loaded load(const std::string& name, Precision prec, bool graphs = true) {
  Loaded l;
  auto ck = Checkpoint::open(std::string(K3_SOURCE_DIR) + "/models/" + name);
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  if (!ck.ok()) return l;
  l.ck = std::move(ck).value();
  ModelOptions opt;
  opt.precision = prec;
  opt.cuda_graph = graphs;
  auto m = gpu::GpuModel::load(*l.ck, opt);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (m.ok()) l.m = std::move(m).value();
  return l;
}

int32_t argmax(const std::vector<float>& v) {
  size_t b = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[b]) b = i;
  return int32_t(b);
}

// n sequences with prompts of different lengths (prefill runs eagerly), twice.
struct Twins {
  std::vector<std::unique_ptr<gpu::GpuSeqState>> a, b;
  std::vector<int32_t> next;
};

Twins make_twins(gpu::GpuModel& m, int n, int64_t prompt, uint32_t seed) {
  Twins t;
  const int32_t V = int32_t(m.config().n_vocab);
  for (int i = 0; i < n; ++i) {
    auto toks = random_tokens(prompt + 3 * i, V, seed + uint32_t(i));
    std::vector<float> la, lb;
    for (auto* set : {&t.a, &t.b}) {
      auto st = m.new_state();
      EXPECT_TRUE(st.ok()) << st.status().message();
      set->push_back(std::move(st).value());
    }
    EXPECT_TRUE(m.forward(*t.a.back(), toks.data(), int64_t(toks.size()), &la, false).ok());
    EXPECT_TRUE(m.forward(*t.b.back(), toks.data(), int64_t(toks.size()), &lb, false).ok());
    EXPECT_EQ(la, lb) << "prefill is not deterministic";
    t.next.push_back(argmax(la));
  }
  return t;
}

// forward_batch over the same spans: eager on states sa into la, then graphs on sb into lb.
void batch_both(gpu::GpuModel& m, std::vector<gpu::GpuSeqState*>& sa, std::vector<gpu::GpuSeqState*>& sb,
                const std::vector<std::span<const int32_t>>& tok, std::vector<std::vector<float>>* la,
                std::vector<std::vector<float>>* lb) {
  m.set_cuda_graph(false);
  Status s = m.forward_batch(sa, tok, la);
  ASSERT_TRUE(s.ok()) << s.message();
  m.set_cuda_graph(true);
  s = m.forward_batch(sb, tok, lb);
  ASSERT_TRUE(s.ok()) << s.message();
}

// One decode step over sequences `idx` of both sets: eager on a, graphs on b; logits must be identical.
void step_both(gpu::GpuModel& m, Twins& t, const std::vector<int>& idx, const std::string& what) {
  std::vector<gpu::GpuSeqState*> sa, sb;
  std::vector<std::span<const int32_t>> tok;
  for (int i : idx) {
    sa.push_back(t.a[size_t(i)].get()), sb.push_back(t.b[size_t(i)].get());
    tok.emplace_back(&t.next[size_t(i)], 1);
  }
  std::vector<std::vector<float>> la, lb;
  batch_both(m, sa, sb, tok, &la, &lb);
  if (::testing::Test::HasFatalFailure()) return;
  for (size_t k = 0; k < idx.size(); ++k) {
    ASSERT_EQ(la[k].size(), lb[k].size());
    ASSERT_EQ(0, std::memcmp(la[k].data(), lb[k].data(), la[k].size() * 4))
        << what << ": sequence " << idx[k] << " graph logits differ from eager (n_past "
        << t.a[size_t(idx[k])]->n_past() << ")";
    EXPECT_EQ(t.a[size_t(idx[k])]->n_past(), t.b[size_t(idx[k])]->n_past());
    t.next[size_t(idx[k])] = argmax(la[k]);
  }
}

void check_family(const std::string& name, Precision prec) {
  Loaded l = load(name, prec);
  ASSERT_TRUE(l.m);
  gpu::GpuModel& m = *l.m;
  // tiny-k31's index_topk is below prompt + steps: the DSA selection becomes sparse on the way.
  Twins t = make_twins(m, 8, 20, 7);
  for (int n : {1, 3, 5, 8}) {
    std::vector<int> idx;
    for (int i = 0; i < n; ++i) idx.push_back(i);
    for (int step = 0; step < 4; ++step)
      step_both(m, t, idx, name + " batch " + std::to_string(n) + " step " + std::to_string(step));
  }
  const gpu::GpuGraphStats s = m.graph_stats();
  std::printf("%s %s: %d graph steps, %d eager steps, %d segments captured, %d replayed, %d failed%s%s\n",
              name.c_str(), prec == Precision::bf16 ? "bf16" : "fp32", s.graph_steps, s.eager_steps,
              s.captures, s.replays, s.failed, s.eager_reason.empty() ? "" : ": ", s.eager_reason.c_str());
  EXPECT_EQ(s.eager_steps, 3);  // the first step of each bucket (1, 4, 8)
  EXPECT_EQ(s.graph_steps, 13);
  EXPECT_GT(s.captures, 0);
  EXPECT_GT(s.replays, s.captures);
}

TEST(GpuGraph, ReplayEqualsEagerTinyKl) {
  SKIP_WITHOUT_GPU();
  check_family("tiny-kl", Precision::fp32);
  check_family("tiny-kl", Precision::bf16);
}

TEST(GpuGraph, ReplayEqualsEagerTinyK3) {
  SKIP_WITHOUT_GPU();
  check_family("tiny-k3", Precision::fp32);
  check_family("tiny-k3", Precision::bf16);
}

TEST(GpuGraph, ReplayEqualsEagerTinyK31) {
  SKIP_WITHOUT_GPU();
  check_family("tiny-k31", Precision::fp32);
  check_family("tiny-k31", Precision::bf16);
}

// Sequences leave and come back: the bucket's graphs are captured again for the new set of states.
TEST(GpuGraph, MembershipChangesRecapture) {
  SKIP_WITHOUT_GPU();
  Loaded l = load("tiny-k3", Precision::bf16);
  ASSERT_TRUE(l.m);
  Twins t = make_twins(*l.m, 4, 9, 11);
  for (const std::vector<int>& idx : std::vector<std::vector<int>>{
           {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 2, 3}, {0, 2, 3}, {1, 0, 2, 3}, {1, 0, 2, 3}})
    step_both(*l.m, t, idx, "membership");
  const int captures = l.m->graph_stats().captures;
  step_both(*l.m, t, {1, 0, 2, 3}, "membership, same set again");
  EXPECT_EQ(l.m->graph_stats().captures, captures) << "an unchanged batch must replay, not capture";
}

// forward_batch writes into the caller's vectors and keeps them across calls (no per-step allocation): an
// idle sequence (empty span) gets an empty vector, a smaller batch shrinks the list, and every row equals the
// same step into fresh vectors (eager on one twin set, graphs on the other).
TEST(GpuGraph, ForwardBatchReusesLogitVectors) {
  SKIP_WITHOUT_GPU();
  Loaded l = load("tiny-k3", Precision::bf16);
  ASSERT_TRUE(l.m);
  gpu::GpuModel& m = *l.m;
  Twins t = make_twins(m, 3, 12, 21);
  const size_t V = size_t(m.config().n_vocab);
  std::vector<std::vector<float>> kept;
  for (int step = 0; step < 4; ++step) {  // all three; sequence 1 idle; sequences 0 and 2; all three
    const std::vector<int> idx = step == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2};
    std::vector<gpu::GpuSeqState*> sa, sb;
    std::vector<std::span<const int32_t>> tok;
    for (int i : idx) {
      sa.push_back(t.a[size_t(i)].get()), sb.push_back(t.b[size_t(i)].get());
      tok.emplace_back(&t.next[size_t(i)], step == 1 && i == 1 ? 0 : 1);
    }
    std::vector<std::vector<float>> fresh;
    batch_both(m, sa, sb, tok, &fresh, &kept);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ASSERT_EQ(kept.size(), idx.size()) << "step " << step;
    for (size_t k = 0; k < idx.size(); ++k) {
      ASSERT_EQ(kept[k].size(), tok[k].empty() ? size_t(0) : V) << "step " << step << " sequence " << idx[k];
      ASSERT_EQ(0, std::memcmp(kept[k].data(), fresh[k].data(), kept[k].size() * 4))
          << "step " << step << " sequence " << idx[k];
      if (!tok[k].empty()) t.next[size_t(idx[k])] = argmax(fresh[k]);
    }
  }
}

// A synthetic context (fill_synthetic) behaves like any other state: graph = eager, n_past advances.
TEST(GpuGraph, SyntheticContext) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"tiny-k3", "tiny-k31"}) {
    Loaded l = load(name, Precision::bf16);
    ASSERT_TRUE(l.m);
    Twins t;
    for (int i = 0; i < 2; ++i)
      for (auto* set : {&t.a, &t.b}) {
        auto st = l.m->new_state();
        ASSERT_TRUE(st.ok());
        Status s = l.m->fill_synthetic(*st.value(), 300 + i, 5 + uint64_t(i));
        ASSERT_TRUE(s.ok()) << s.message();
        set->push_back(std::move(st).value());
      }
    t.next = {3, 4};
    for (int step = 0; step < 3; ++step) step_both(*l.m, t, {0, 1}, std::string(name) + " synthetic");
    EXPECT_EQ(t.b[0]->n_past(), 303);
  }
}

TEST(GpuGraph, OptionOff) {
  SKIP_WITHOUT_GPU();
  Loaded l = load("tiny-k3", Precision::fp32, /*graphs=*/false);
  ASSERT_TRUE(l.m);
  auto st = l.m->new_state();
  ASSERT_TRUE(st.ok());
  std::vector<float> lg;
  for (int32_t tok : {1, 2, 3}) ASSERT_TRUE(l.m->forward(*st.value(), &tok, 1, &lg, false).ok());
  EXPECT_EQ(l.m->graph_stats().graph_steps + l.m->graph_stats().eager_steps, 0);
}

}  // namespace
}  // namespace k3
