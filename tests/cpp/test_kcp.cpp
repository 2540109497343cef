// test_kcp.cpp: KDA context parallelism (dist/kcp.h) with in-process ranks gives the single-rank logits.
//
// A packed prefill of several documents, split over 1, 2, 4 ranks: one document across every rank;
// documents starting inside slices and exactly at a slice start; a slice shorter than the conv window (the
// halo passes through it). Reference: one rank, one SeqState per document, every row. fp32, NMSE <= 1e-6.
// The rank holding a document's end then decodes one more token from its state like the single rank does.
#include <gtest/gtest.h>

#include "dist/kcp.h"
#include "test_dist_util.h"

namespace k3 {
namespace {

using namespace disttest;

struct Ref {
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<SeqState>> states;
  std::vector<float> logits;
};

Ref reference(const Checkpoint& ck, const std::vector<int32_t>& tok, const std::vector<int64_t>& cu,
              const ModelOptions& opt) {
  Ref r;
  auto m = Model::load(ck, opt);
  EXPECT_TRUE(m.ok()) << m.status().message();
  r.model = std::move(m).value();
  std::vector<SeqState*> ptrs;
  std::vector<int64_t> rows;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    r.states.push_back(r.model->new_state());
    ptrs.push_back(r.states.back().get());
  }
  for (int64_t t = 0; t < cu.back(); ++t) rows.push_back(t);
  EXPECT_TRUE(r.model->forward_packed(ptrs, tok.data(), cu, rows, &r.logits).ok());
  return r;
}

void check_layout(const Checkpoint& ck, const std::vector<int32_t>& tok, const KcpLayout& layout,
                  const std::string& what, Precision prec = Precision::fp32, double bound = 1e-6) {
  ASSERT_TRUE(layout.validate().ok()) << what;
  ModelOptions base = test_options();
  base.precision = prec;
  Ref ref = reference(ck, tok, layout.cu_seqlens, base);
  const int n = layout.n_rank();
  auto comms = make_inproc_comms(n);
  std::vector<std::unique_ptr<KcpHooks>> hooks(static_cast<size_t>(n));
  std::vector<std::unique_ptr<Model>> models(static_cast<size_t>(n));
  std::vector<std::vector<std::unique_ptr<SeqState>>> states(static_cast<size_t>(n));
  std::vector<std::vector<float>> logits(static_cast<size_t>(n));
  std::vector<std::string> err(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    hooks[size_t(r)] = std::make_unique<KcpHooks>(*comms[size_t(r)], layout);
    ModelOptions opt = base;
    opt.parallel = hooks[size_t(r)].get();
    auto m = Model::load(ck, opt);
    if (!m.ok()) {
      err[size_t(r)] = m.status().message();
      return;
    }
    models[size_t(r)] = std::move(m).value();
    Status s = kcp_prefill(*models[size_t(r)], *hooks[size_t(r)], tok.data(), &logits[size_t(r)],
                           &states[size_t(r)]);
    if (!s.ok()) err[size_t(r)] = s.message();
  });
  std::vector<float> all;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(err[size_t(r)].empty()) << what << " rank " << r << ": " << err[size_t(r)];
    all.insert(all.end(), logits[size_t(r)].begin(), logits[size_t(r)].end());
  }
  const double e = nmse(all, ref.logits);
  std::printf("%s, %d ranks: NMSE %.3g\n", what.c_str(), n, e);
  EXPECT_LE(e, bound) << what << ", " << n << " ranks";

  // The last document's state lives on the last rank, in its last piece: decode one token from both.
  const int32_t next = tok[3];
  std::vector<float> a, b;
  SeqState& kst = *states[size_t(n - 1)].back();
  EXPECT_EQ(kst.n_past(), ref.states.back()->n_past()) << what;
  ASSERT_TRUE(ref.model->forward(*ref.states.back(), &next, 1, &a, false).ok());
  ASSERT_TRUE(ref.model->forward(kst, &next, 1, &b, false).ok());
  EXPECT_LE(nmse(b, a), bound) << what << ": decode after the parallel prefill";
}

void check_model(const char* name) {
  auto ck = open_tiny(name);
  ASSERT_TRUE(ck);
  const int64_t T = 41;
  const auto tok = random_tokens(T, ck->config().n_vocab, 5);
  for (int n : {1, 2, 4}) {
    auto one = KcpLayout::even({0, T}, n);  // one document across every rank
    ASSERT_TRUE(one.ok());
    check_layout(*ck, tok, *one, std::string(name) + " one document");
    auto docs = KcpLayout::even({0, 7, 15, 29, T}, n);  // boundaries inside slices
    ASSERT_TRUE(docs.ok());
    check_layout(*ck, tok, *docs, std::string(name) + " four documents");
  }
  // Uneven slices: a 2-token slice (shorter than the conv window), a document starting at a slice start.
  KcpLayout l{{0, 5, 12, 30, T}, {0, 10, 12, 20, T}};
  check_layout(*ck, tok, l, std::string(name) + " uneven slices");
}

TEST(Kcp, TinyKl) {
  check_model("tiny-kl");
}
TEST(Kcp, TinyK3) {
  check_model("tiny-k3");
}
TEST(Kcp, TinyK31) {
  check_model("tiny-k31");
}

// bf16 mode: the composed KDA state differs from the sequential one by fp32 roundoff only, and the DSA
// index keys gathered from other ranks carry the same bf16 rounding as the ones dsa_select computes.
TEST(Kcp, Bf16StaysClose) {
  auto ck = open_tiny("tiny-k31");
  ASSERT_TRUE(ck);
  const auto tok = random_tokens(41, ck->config().n_vocab, 5);
  auto l = KcpLayout::even({0, 7, 15, 29, 41}, 4);
  ASSERT_TRUE(l.ok());
  check_layout(*ck, tok, *l, "tiny-k31 bf16 four documents", Precision::bf16, 1e-4);
}

TEST(Kcp, LayoutChecks) {
  EXPECT_FALSE(KcpLayout::even({0, 3}, 4).ok());        // fewer tokens than ranks
  EXPECT_FALSE(KcpLayout::even({0, 5, 5, 9}, 2).ok());  // empty document
  KcpLayout bad{{0, 10}, {0, 4, 9}};
  EXPECT_FALSE(bad.validate().ok());
  KcpLayout l{{0, 5, 12, 30}, {0, 10, 12, 30}};
  auto p = kcp_pieces(l, 0);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_FALSE(p[0].continues());
  EXPECT_EQ(p[1].t0, 5);
  auto p1 = kcp_pieces(l, 1);
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_TRUE(p1[0].continues());
  EXPECT_EQ(p1[0].doc_start, 5);
  auto p2 = kcp_pieces(l, 2);
  ASSERT_EQ(p2.size(), 1u);
  EXPECT_FALSE(p2[0].continues());
  // A layout for 3 ranks on a 2-rank communicator: a Status, not a crash.
  auto comms = make_inproc_comms(2);
  KcpHooks h(*comms[0], l);
  EXPECT_FALSE(h.status().ok());
  auto ck = open_tiny("tiny-kl");
  ASSERT_TRUE(ck);
  auto m = Model::load(*ck, test_options());
  ASSERT_TRUE(m.ok());
  const auto tok = random_tokens(30, ck->config().n_vocab, 1);
  EXPECT_FALSE(kcp_prefill(**m, h, tok.data(), nullptr, nullptr).ok());
}

}  // namespace
}  // namespace k3
