// fuzz_npy: arbitrary bytes as an .npy file -> parse_npy (engine/npy.h). Must never crash or allocate
// more than the input implies; an accepted array must hold numel values and survive encode -> parse.
#include <cstdint>
#include <string_view>

#include "engine/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = k3::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  if (!r.ok()) return 0;
  const k3::NpyArray& a = r.value();
  const bool f32 = a.type == k3::NpyType::f32;
  K3_ASSERT(int64_t(f32 ? a.f32.size() : a.i32.size()) == a.numel());
  K3_ASSERT(int64_t(a.numel()) * 4 <= int64_t(size));
  const void* values = f32 ? static_cast<const void*>(a.f32.data()) : static_cast<const void*>(a.i32.data());
  auto again = k3::parse_npy(k3::encode_npy(values, a.type, a.shape), "again.npy");
  K3_ASSERT(again.ok() && again->shape == a.shape && again->type == a.type);
  K3_ASSERT(f32 ? again->f32.size() == a.f32.size() : again->i32 == a.i32);
  return 0;
}
