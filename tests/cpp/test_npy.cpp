// .npy reader/writer: round trips, NumPy's own byte layout, and malformed files rejected with a Status.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/npy.h"

namespace k3 {
namespace {

// A v1.0 file laid out exactly as numpy.save writes it: the dict padded with spaces and '\n' so that the
// data starts at a multiple of 64.
std::string numpy_file(const std::string& dict, const std::string& data) {
  std::string h = dict;
  const size_t unpadded = 10 + h.size() + 1;
  h.append((64 - unpadded % 64) % 64, ' ');
  h.push_back('\n');
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out.push_back(char(h.size() & 0xff));
  out.push_back(char(h.size() >> 8));
  return out + h + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Npy, EncodeMatchesNumpyLayout) {
  const std::vector<float> x = {1.f, -2.f, 3.5f, 0.f, 1e-3f, 7.f};
  const std::string got = encode_npy(x.data(), NpyType::f32, {2, 3});
  const std::string want = numpy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw(x));
  EXPECT_EQ(got, want);
  EXPECT_EQ((got.size() - x.size() * 4) % 64, 0u);
  const std::vector<int32_t> ids = {5, 6, 7};
  EXPECT_EQ(encode_npy(ids.data(), NpyType::i32, {3}),
            numpy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", raw(ids)));
}

TEST(Npy, RoundTripThroughAFile) {
  const std::string path = ::testing::TempDir() + "k3_npy_roundtrip.npy";
  std::vector<float> x(4 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.25f - 3.f;
  ASSERT_TRUE(write_npy(path, x.data(), {4, 5}).ok());
  auto a = read_npy(path);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->type, NpyType::f32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(a->f32, x);

  const std::vector<int32_t> ids = {-1, 0, 163839, 42};
  ASSERT_TRUE(write_npy(path, ids.data(), {4}).ok());
  auto b = read_npy(path);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->type, NpyType::i32);
  EXPECT_EQ(b->i32, ids);
  std::remove(path.c_str());
}

TEST(Npy, ScalarAndEmptyShapes) {
  const float s = 2.5f;
  auto a = parse_npy(encode_npy(&s, NpyType::f32, {}));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->shape.empty());
  ASSERT_EQ(a->f32.size(), 1u);
  EXPECT_EQ(a->f32[0], 2.5f);
  auto e = parse_npy(encode_npy(nullptr, NpyType::i32, {0, 7}));
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->numel(), 0);
}

TEST(Npy, ReadsNumpyDefaultInt64AndFloat64) {
  const std::vector<int64_t> v = {-2, -1, 0, 1, 2, 3};
  auto a = parse_npy(numpy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", raw(v)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->type, NpyType::i32);
  EXPECT_EQ(a->i32, (std::vector<int32_t>{-2, -1, 0, 1, 2, 3}));
  const std::vector<double> d = {1.5, -2.25};
  auto b = parse_npy(numpy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", raw(d)));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->f32, (std::vector<float>{1.5f, -2.25f}));
}

TEST(Npy, ReadsUint32TokenIdsRangeChecked) {
  const std::vector<uint32_t> v = {0, 7, 163839};
  auto a = parse_npy(numpy_file("{'descr': '<u4', 'fortran_order': False, 'shape': (3,), }", raw(v)));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->i32, (std::vector<int32_t>{0, 7, 163839}));
  const std::vector<uint32_t> big = {1u << 31};
  auto b = parse_npy(numpy_file("{'descr': '<u4', 'fortran_order': False, 'shape': (1,), }", raw(big)), "t.npy");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("does not fit in int32"), std::string::npos) << b.status().message();
}

TEST(Npy, RejectsMalformedFilesWithAStatus) {
  const std::vector<float> x = {1.f, 2.f};
  const std::string good = numpy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", raw(x));
  ASSERT_TRUE(parse_npy(good).ok());
  auto fails = [](const std::string& bytes, const char* needle) {
    auto r = parse_npy(bytes, "f.npy");
    EXPECT_FALSE(r.ok()) << needle;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("f.npy"), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    }
  };
  fails("not a numpy file at all", "magic");
  fails(good.substr(0, 20), "truncated");
  fails(good.substr(0, good.size() - 1), "bytes");
  fails(good + "x", "bytes");
  fails(numpy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", raw(x)), "not supported");
  fails(numpy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", raw(x)), "Fortran");
  fails(numpy_file("{'descr': '<f4', 'shape': (2,), }", raw(x)), "fortran_order");
  fails(numpy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (a,), }", raw(x)), "shape");
  fails(numpy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", raw(x)),
        "shape");
  fails(numpy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", raw(x)),
        "shape");
  const std::vector<int64_t> big = {int64_t(1) << 40};
  fails(numpy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", raw(big)), "int32");
  EXPECT_EQ(read_npy("/nonexistent/dir/x.npy").status().code(), Code::not_found);
}

}  // namespace
}  // namespace k3
