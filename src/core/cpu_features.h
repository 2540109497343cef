// cpu_features.h: which SIMD kernels this CPU can run, detected once at run time (cpuid + xgetbv).
//
// Kernels are compiled with function target attributes (no global -march), so one binary carries the
// portable fallback and the AVX-512 paths. Dispatch reads cpu_level():
//
//   CpuLevel::portable     plain C++ (whatever the compiler's baseline is); always available
//   CpuLevel::avx512       AVX-512 F+BW+VL+DQ, OS saves ZMM state; fp32 FMA kernels, f16c conversions
//   CpuLevel::avx512_bf16  avx512 + AVX512_BF16 (vdpbf16ps)
//
// cpu_level() = min(detected, limit). The limit comes from the env var K3_CPU_LEVEL
// (portable | avx512 | avx512_bf16), read once, or from set_cpu_level_limit() (tests, test-ops backends),
// so CI can cover the fallback on a machine that has AVX-512. Not meant to change while ops run.
#pragma once

#include <string>

namespace k3 {

enum class CpuLevel : int { portable = 0, avx512 = 1, avx512_bf16 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool os_zmm = false;  // XCR0 enables opmask + ZMM state
};

// What the hardware (and OS) offers; detected once.
const CpuFeatures& cpu_features();
// The best level the hardware offers.
CpuLevel cpu_level_detected();
// The level kernels dispatch on: min(detected, limit).
CpuLevel cpu_level();
// Caps the dispatch level (CpuLevel::avx512_bf16 = no cap). Returns the previous limit.
CpuLevel set_cpu_level_limit(CpuLevel limit);

const char* cpu_level_name(CpuLevel l);
// Parses "portable" | "avx512" | "avx512_bf16"; false if unknown.
bool cpu_level_from_name(const std::string& name, CpuLevel* out);
// "avx2 fma f16c avx512f ... (level avx512_bf16)"
std::string cpu_features_str();

}  // namespace k3
