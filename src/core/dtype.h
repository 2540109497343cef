// dtype.h: the element types a checkpoint or a cache can hold, and exact scalar conversions.
//
//   bf16      1-8-7, round-to-nearest-even from fp32 (NaN stays NaN)
//   f16       IEEE half
//   f8_e4m3   OCP E4M3FN (no inf; 0x7f/0xff are NaN), max 448
//   e2m1      MXFP4 element: {0, .5, 1, 1.5, 2, 3, 4, 6} x sign, low nibble first (MODEL.md §9)
//   e8m0      MX block scale: 2^(e-127); e = 255 is NaN and is rejected at load time
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace k3 {

enum class DType : uint8_t { f32, f16, bf16, f8_e4m3, u8, i8, i32, i64, f64, bool_ };

// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    default: return 1;
  }
}

// Safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; returns false for an unknown one.
bool dtype_from_name(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Rounds an fp32 value to the nearest bf16 value, kept in fp32 (the "bf16 rounding point").
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// OCP FP8 E4M3FN.
float f8_e4m3_to_f32(uint8_t b);

// MXFP4 element (4 bits) to its exact value.
inline float e2m1_to_f32(uint8_t nib) {
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = kMag[nib & 7];
  return (nib & 8) ? -m : m;
}

// MX block scale: 2^(e-127). e = 255 (NaN) must be rejected before this is called.
inline float e8m0_to_f32(uint8_t e) { return std::ldexp(1.0f, int(e) - 127); }

}  // namespace k3
