#include "core/cpu_features.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define K3_X86 1
#endif

namespace k3 {

namespace {

#ifdef K3_X86
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef K3_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  f.os_zmm = (xcr0 & 0xe6) == 0xe6;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_ymm && (b & (1u << 5));
  f.avx512f = f.os_zmm && (b & (1u << 16));
  f.avx512dq = f.avx512f && (b & (1u << 17));
  f.avx512bw = f.avx512f && (b & (1u << 30));
  f.avx512vl = f.avx512f && (b & (1u << 31));
  f.avx512_vnni = f.avx512f && (c & (1u << 11));
  f.avx512_fp16 = f.avx512f && (d & (1u << 23));
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512_bf16 = f.avx512f && (a & (1u << 5));
#endif
  return f;
}

CpuLevel env_limit() {
  const char* s = std::getenv("K3_CPU_LEVEL");
  CpuLevel l = CpuLevel::avx512_bf16;
  if (s && *s) cpu_level_from_name(s, &l);
  return l;
}

std::atomic<int>& limit_slot() {
  static std::atomic<int> limit{int(env_limit())};
  return limit;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

CpuLevel cpu_level_detected() {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.f16c && f.fma;
  if (!avx512) return CpuLevel::portable;
  return f.avx512_bf16 ? CpuLevel::avx512_bf16 : CpuLevel::avx512;
}

CpuLevel cpu_level() {
  static const CpuLevel detected = cpu_level_detected();
  const int limit = limit_slot().load(std::memory_order_relaxed);
  return CpuLevel(limit < int(detected) ? limit : int(detected));
}

CpuLevel set_cpu_level_limit(CpuLevel limit) { return CpuLevel(limit_slot().exchange(int(limit))); }

const char* cpu_level_name(CpuLevel l) {
  switch (l) {
    case CpuLevel::portable: return "portable";
    case CpuLevel::avx512: return "avx512";
    case CpuLevel::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

bool cpu_level_from_name(const std::string& name, CpuLevel* out) {
  for (CpuLevel l : {CpuLevel::portable, CpuLevel::avx512, CpuLevel::avx512_bf16})
    if (name == cpu_level_name(l)) {
      *out = l;
      return true;
    }
  return false;
}

std::string cpu_features_str() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += std::string(s.empty() ? "" : " ") + name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  return s + " (level " + cpu_level_name(cpu_level()) + ")";
}

}  // namespace k3
