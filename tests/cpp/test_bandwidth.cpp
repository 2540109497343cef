// Read bandwidth: the measurement runs, respects its options, and gives a physically plausible number.
#include <gtest/gtest.h>

#include "core/bandwidth.h"
#include "core/thread_pool.h"

namespace k3 {
namespace {

TEST(Bandwidth, SmallBufferGivesAPlausibleRate) {
  BandwidthOptions opt;
  opt.buffer_bytes = (8 << 20) + 40;  // rounded down to whole 64-byte lines
  opt.min_seconds = 0.01;
  ThreadPool pool(2);
  auto r = measure_read_bandwidth(&pool, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->buffer_bytes, 8 << 20);
  EXPECT_EQ(r->n_threads, 2);
  EXPECT_GE(r->n_passes, 3);
  EXPECT_GT(r->bytes_per_s, 1e8);   // 100 MB/s: any machine that runs the tests
  EXPECT_LT(r->bytes_per_s, 1e13);  // 10 TB/s: no CPU today
  EXPECT_LE(r->median_bytes_per_s, r->bytes_per_s);
}

TEST(Bandwidth, SingleThreadWithoutPool) {
  BandwidthOptions opt;
  opt.buffer_bytes = 1 << 20;
  opt.min_seconds = 0;
  opt.min_passes = 5;
  auto r = measure_read_bandwidth(nullptr, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_threads, 1);
  EXPECT_EQ(r->n_passes, 5);
}

}  // namespace
}  // namespace k3
