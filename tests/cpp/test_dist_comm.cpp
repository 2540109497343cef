// test_dist_comm.cpp: the in-process communicator (dist/comm.h), expert placement (dist/ep.h) and the KDA
// segment transition (ops/kda_transition.h).
//
//   every collective on 3 ranks against values computed here; mismatched all_to_allv counts give a Status
//   ep_placement: capacity ceil(E/n) per rank, round robin without loads, greedy balance with loads
//   kda_transition: cpu == fp64 ref; S_T from any S_0 == M S_0 + S~ (the recurrence run directly)
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "dist/comm.h"
#include "dist/ep.h"
#include "ops/kda.h"
#include "ops/kda_transition.h"
#include "test_dist_util.h"

namespace k3 {
namespace {

using disttest::nmse;
using disttest::run_ranks;

TEST(DistComm, CollectivesOnThreeRanks) {
  const int n = 3;
  auto comms = make_inproc_comms(n);
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    Comm& c = *comms[size_t(r)];
    auto check = [&](bool ok, const std::string& what) {
      if (!ok && errors[size_t(r)].empty()) errors[size_t(r)] = what;
    };
    check(c.rank() == r && c.size() == n, "rank/size");
    // all_reduce: x[i] = r * 10 + i -> sum_r = 30 + 3 i
    std::vector<float> x(5);
    for (int i = 0; i < 5; ++i) x[size_t(i)] = float(r * 10 + i);
    check(c.all_reduce_sum(x.data(), 5).ok(), "all_reduce status");
    for (int i = 0; i < 5; ++i) check(x[size_t(i)] == float(30 + 3 * i), "all_reduce value");
    // all_gather of 2 ints
    int32_t mine[2] = {r, -r}, all[6] = {};
    check(c.all_gather(mine, sizeof mine, all).ok(), "all_gather status");
    for (int j = 0; j < n; ++j) check(all[2 * j] == j && all[2 * j + 1] == -j, "all_gather value");
    // all_gatherv: rank j contributes j + 1 floats of value j
    std::vector<float> v(size_t(r + 1), float(r)), gv(6);
    const int64_t gb[3] = {4, 8, 12};
    check(c.all_gatherv(v.data(), gb, gv.data()).ok(), "all_gatherv status");
    const float want_gv[6] = {0, 1, 1, 2, 2, 2};
    for (int i = 0; i < 6; ++i) check(gv[size_t(i)] == want_gv[i], "all_gatherv value");
    // reduce_scatter: in[j*2 + i] = r + j + i; out[i] = sum_r (r + rank + i) = 3 + 3 (rank + i)
    std::vector<float> in(6), out(2);
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) in[size_t(j * 2 + i)] = float(r + j + i);
    check(c.reduce_scatter_sum(in.data(), out.data(), 2).ok(), "reduce_scatter status");
    for (int i = 0; i < 2; ++i) check(out[size_t(i)] == float(3 + 3 * (r + i)), "reduce_scatter value");
    // all_to_allv: rank r sends j + 1 bytes of value 16 r + j to rank j
    std::vector<uint8_t> send;
    std::vector<int64_t> sb(3), rb(3);
    for (int j = 0; j < 3; ++j) {
      sb[size_t(j)] = j + 1;
      rb[size_t(j)] = r + 1;
      for (int b = 0; b <= j; ++b) send.push_back(uint8_t(16 * r + j));
    }
    std::vector<uint8_t> recv(size_t(3 * (r + 1)));
    check(c.all_to_allv(send.data(), sb, recv.data(), rb).ok(), "all_to_allv status");
    for (int j = 0; j < 3; ++j)
      for (int b = 0; b <= r; ++b)
        check(recv[size_t(j * (r + 1) + b)] == uint8_t(16 * j + r), "all_to_allv value");
    // wrong expectation: a Status, no hang
    std::vector<int64_t> bad = rb;
    bad[0] += 1;
    std::vector<uint8_t> big(64);
    check(!c.all_to_allv(send.data(), sb, big.data(), bad).ok(), "all_to_allv mismatch detected");
    // ring send/recv, twice (FIFO order per pair)
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int round = 0; round < 2; ++round) {
      int64_t msg = 100 * r + round, got = -1;
      check(c.send(&msg, sizeof msg, next).ok(), "send");
      check(c.recv(&got, sizeof got, prev).ok() && got == 100 * prev + round, "recv value");
    }
    int64_t wrong = 0;
    check(c.send(&wrong, sizeof wrong, next).ok(), "send");
    check(!c.recv(&wrong, 4, prev).ok(), "recv size mismatch detected");
    check(c.barrier().ok(), "barrier");
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(errors[size_t(r)].empty()) << "rank " << r << ": " << errors[size_t(r)];
}

TEST(DistEp, PlacementBalances) {
  std::vector<int> rr = ep_placement(8, 4);
  for (int e = 0; e < 8; ++e) EXPECT_EQ(rr[size_t(e)], e % 4);
  // loads: one heavy expert and a skewed tail; capacity 2 per rank, greedy LPT.
  const std::vector<double> load = {100, 1, 1, 1, 60, 50, 40, 2};
  std::vector<int> own = ep_placement(8, 4, load);
  std::vector<double> sum(4, 0.0);
  std::vector<int> held(4, 0);
  for (int e = 0; e < 8; ++e) sum[size_t(own[size_t(e)])] += load[size_t(e)], ++held[size_t(own[size_t(e)])];
  for (int r = 0; r < 4; ++r) EXPECT_EQ(held[size_t(r)], 2);
  EXPECT_EQ(own[0], 0);  // the heaviest first, on rank 0; it must not share with another heavy one
  EXPECT_LE(*std::max_element(sum.begin(), sum.end()), 101.0);
  EXPECT_LE(*std::max_element(sum.begin(), sum.end()) - *std::min_element(sum.begin(), sum.end()), 60.0);
  std::vector<int> uneven = ep_placement(5, 2);  // capacity 3
  EXPECT_EQ(std::count(uneven.begin(), uneven.end(), 0), 3);
}

struct Segment {
  int64_t T;
  int H, K, V;
  std::vector<float> q, k, v, g, beta;
  Segment(int64_t T, int H, int K, int V, uint32_t seed) : T(T), H(H), K(K), V(V) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ug(-3.f, -0.01f), ub(0.05f, 0.95f);
    q.resize(size_t(T * H * K)), k.resize(q.size()), g.resize(q.size()), v.resize(size_t(T * H * V));
    beta.resize(size_t(T * H));
    for (auto* a : {&q, &k, &v})
      for (float& x : *a) x = nd(gen);
    for (float& x : g) x = ug(gen);
    for (float& x : beta) x = ub(gen);
    for (int64_t r = 0; r < T * H; ++r)
      for (auto* a : {&q, &k}) {
        float ss = 0;
        for (int i = 0; i < K; ++i) ss += (*a)[size_t(r * K + i)] * (*a)[size_t(r * K + i)];
        for (int i = 0; i < K; ++i) (*a)[size_t(r * K + i)] /= std::sqrt(ss);
      }
  }
  KdaTransitionParams params(std::vector<float>& M, std::vector<float>& S) const {
    M.assign(size_t(H * K * K), NAN), S.assign(size_t(H * K * V), NAN);
    KdaTransitionParams p;
    p.n_tok = T, p.n_head = H, p.d_k = K, p.d_v = V, p.chunk = 16;
    p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data(), p.M = M.data(), p.S = S.data();
    return p;
  }
};

TEST(KdaTransition, CpuMatchesRefAndComposes) {
  for (int64_t T : {1, 17, 40}) {
    Segment s(T, 2, 16, 12, uint32_t(T));
    std::vector<float> Mr, Sr, Mc, Sc;
    kda_transition_ref(s.params(Mr, Sr));
    kda_transition_cpu(s.params(Mc, Sc), nullptr);
    EXPECT_LE(nmse(Mc, Mr), 1e-10) << "T=" << T;
    EXPECT_LE(nmse(Sc, Sr), 1e-10) << "T=" << T;
    // The recurrence from a random S0 ends in M S0 + S~.
    std::vector<float> S0(size_t(2 * 16 * 12)), o(size_t(T * 2 * 12));
    std::mt19937 gen(7);
    std::normal_distribution<float> nd;
    for (float& x : S0) x = nd(gen);
    std::vector<float> direct = S0, composed = S0;
    KdaParams p;
    p.n_tok = T, p.n_head = 2, p.d_k = 16, p.d_v = 12;
    p.q = s.q.data(), p.k = s.k.data(), p.v = s.v.data(), p.g = s.g.data(), p.beta = s.beta.data();
    p.S = direct.data(), p.o = o.data();
    kda_ref(p);
    kda_transition_apply(Mr.data(), Sr.data(), 2, 16, 12, composed.data());
    EXPECT_LE(nmse(composed, direct), 1e-10) << "T=" << T;
  }
}

}  // namespace
}  // namespace k3
