// test_dist_nccl.cpp: the NCCL communicator (dist/comm_nccl.cu) on real GPUs: world size 1 on one GPU, and
// world size 2 (two threads, one GPU each, TCP rendezvous on 127.0.0.1) when two GPUs are visible. Every
// collective is checked against values computed here. Skips without NCCL in the build or without a GPU.
#include <gtest/gtest.h>

#include <thread>

#include "core/cuda_check.h"
#include "dist/comm.h"

#ifdef K3_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace k3 {
namespace {

TEST(DistNccl, RendezvousFromEnvironment) {
  NcclRendezvous rv;
  rv.rank = 1, rv.world_size = 1;
  EXPECT_FALSE(rv.resolve().ok());  // rank outside the world
  NcclRendezvous ok;
  ok.rank = 0, ok.world_size = 2, ok.addr = "127.0.0.1", ok.port = 29511;
  EXPECT_TRUE(ok.resolve().ok());
  EXPECT_EQ(ok.local_rank, 0);
  if (!nccl_available()) {
    EXPECT_EQ(make_nccl_comm(ok).status().code(), Code::unsupported);
  }
}

#ifdef K3_HAVE_NCCL
// One rank's checks; returns "" or what failed.
std::string exercise(Comm& c) {
  const int n = c.size(), r = c.rank();
  auto up = [](const std::vector<float>& h) {
    float* d = nullptr;
    cudaMalloc(&d, h.size() * sizeof(float));
    cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    return d;
  };
  auto down = [](const float* d, size_t n) {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  };
  // all_reduce: x[i] = 10 r + i -> sum = 10 n(n-1)/2 + n i
  std::vector<float> x(5);
  for (int i = 0; i < 5; ++i) x[size_t(i)] = float(10 * r + i);
  float* dx = up(x);
  if (!c.all_reduce_sum(dx, 5).ok()) return "all_reduce status";
  auto hx = down(dx, 5);
  for (int i = 0; i < 5; ++i)
    if (hx[size_t(i)] != float(5 * n * (n - 1) + n * i)) return "all_reduce value";
  // all_gatherv: rank j contributes j + 1 floats of value j
  std::vector<float> mine(size_t(r + 1), float(r));
  std::vector<int64_t> bytes;
  size_t total = 0;
  for (int j = 0; j < n; ++j) bytes.push_back((j + 1) * 4), total += size_t(j + 1);
  float* dm = up(mine);
  float* dg = up(std::vector<float>(total, -1.f));
  if (!c.all_gatherv(dm, bytes, dg).ok()) return "all_gatherv status";
  auto hg = down(dg, total);
  for (int j = 0, o = 0; j < n; ++j)
    for (int i = 0; i <= j; ++i, ++o)
      if (hg[size_t(o)] != float(j)) return "all_gatherv value";
  // reduce_scatter: in[j*2 + i] = r + j + i -> out[i] = sum_r (r + rank + i)
  std::vector<float> in(size_t(2 * n));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < 2; ++i) in[size_t(j * 2 + i)] = float(r + j + i);
  float* di = up(in);
  float* dout = up(std::vector<float>(2, 0.f));
  if (!c.reduce_scatter_sum(di, dout, 2).ok()) return "reduce_scatter status";
  auto ho = down(dout, 2);
  for (int i = 0; i < 2; ++i)
    if (ho[size_t(i)] != float(n * (n - 1) / 2 + n * (r + i))) return "reduce_scatter value";
  // all_to_allv: one float 100 r + j to rank j
  std::vector<float> s(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) s[size_t(j)] = float(100 * r + j);
  std::vector<int64_t> b(static_cast<size_t>(n), 4);
  float* ds = up(s);
  float* drv = up(std::vector<float>(static_cast<size_t>(n), -1.f));
  if (!c.all_to_allv(ds, b, drv, b).ok()) return "all_to_allv status";
  auto hr = down(drv, size_t(n));
  for (int j = 0; j < n; ++j)
    if (hr[size_t(j)] != float(100 * j + r)) return "all_to_allv value";
  if (!c.barrier().ok()) return "barrier";
  for (float* p : {dx, dm, dg, di, dout, ds, drv}) cudaFree(p);
  return "";
}

TEST(DistNccl, WorldOfOne) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  NcclRendezvous rv;
  rv.rank = 0, rv.world_size = 1, rv.local_rank = 0, rv.addr = "127.0.0.1", rv.port = 29512;
  auto c = make_nccl_comm(rv);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(exercise(**c), "");
}

TEST(DistNccl, WorldOfTwoOnTwoGpus) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << cuda::device_count();
  std::string err[2];
  std::vector<std::thread> th;
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      NcclRendezvous rv;
      rv.rank = r, rv.world_size = 2, rv.local_rank = r, rv.addr = "127.0.0.1", rv.port = 29513;
      auto c = make_nccl_comm(rv);
      err[r] = c.ok() ? exercise(**c) : c.status().message();
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(err[0], "");
  EXPECT_EQ(err[1], "");
}
#else
TEST(DistNccl, WorldOfOne) {
  GTEST_SKIP() << "built without NCCL (-DK3_CUDA=ON -DK3_NCCL=ON)";
}
#endif

}  // namespace
}  // namespace k3
