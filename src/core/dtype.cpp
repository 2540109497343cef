#include "core/dtype.h"

namespace k3 {

namespace {
struct NamedType {
  std::string_view name;
  DType type;
};
constexpr NamedType kNames[] = {
    {"F32", DType::f32},     {"F16", DType::f16}, {"BF16", DType::bf16}, {"F8_E4M3", DType::f8_e4m3},
    {"U8", DType::u8},       {"I8", DType::i8},   {"I32", DType::i32},   {"I64", DType::i64},
    {"F64", DType::f64},     {"BOOL", DType::bool_},
};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.name;
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& n : kNames)
    if (n.name == name) {
      *out = n.type;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 0x400), int(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  if (a >= 65520.f) return uint16_t(sign | 0x7c00);
  if (a < std::ldexp(1.f, -14)) {  // subnormal: round to a multiple of 2^-24
    const float q = std::nearbyint(a * 16777216.f);
    return uint16_t(sign | uint32_t(q));
  }
  int e;
  const float m = std::frexp(a, &e);                            // a = m * 2^e, m in [0.5, 1)
  const uint32_t mant = uint32_t(std::nearbyint(m * 2048.f));  // 11 bits incl. hidden
  uint32_t exp = uint32_t(e - 1 + 15), frac = mant - 1024;
  if (mant == 2048) exp += 1, frac = 0;
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  return uint16_t(sign | (exp << 10) | frac);
}

float f8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
  if (exp == 15 && man == 7) return NAN;
  float v = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(man | 8), int(exp) - 10);
  return sign ? -v : v;
}

}  // namespace k3
