// glu.h: gated activations of the MLPs (MODEL.md §8.1), computed in fp32.
//
//   SiTU (K3):  a = beta1 * tanh(g / beta1) * sigmoid(g)     beta1 = activation_situ_beta (4)
//               b = beta2 * tanh(u / beta2)                   beta2 = activation_situ_linear_beta (25);
//                   key absent (beta2 <= 0): b = u
//               h = a * b                                     |h| <= beta1 * beta2
//   SiLU (KL):  h = silu(g) * u = g * sigmoid(g) * u
//   bf16 mode:  h is rounded to bf16 (the model's rounding point); fp32 mode keeps it.
//
// g, u: [n_tok, d] with row strides ldg, ldu (a fused gate_up output [n_tok, 2d] is g = row, u = row + d,
// ldg = ldu = 2d); h: [n_tok, d] with row stride ldh. In place into g is allowed (h == g, ldh == ldg).
#pragma once

#include <cstdint>

#include "core/gpu.h"

#include "ops/precision.h"

namespace k3 {

class ThreadPool;

enum class GluKind : uint8_t { silu, situ };

struct GluParams {
  GluKind kind = GluKind::situ;
  int64_t n_tok = 0, d = 0;
  const float* g = nullptr;  // [n_tok, d], row stride ldg (0: d)
  int64_t ldg = 0;
  const float* u = nullptr;  // [n_tok, d], row stride ldu (0: d)
  int64_t ldu = 0;
  float* h = nullptr;        // [n_tok, d], row stride ldh (0: d)
  int64_t ldh = 0;
  float beta1 = 4.0f;        // SiTU only
  float beta2 = 25.0f;       // SiTU only; <= 0 means the config key is absent (b = u)
  Precision precision = Precision::bf16;
};

// Plain reference: fp64 tanh / exp from <cmath>.
void glu_ref(const GluParams& p);
// Fast CPU: branchless exp/tanh (vec_math.h), AVX-512 when present, threads over tokens.
void glu_cpu(const GluParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void glu_cuda(const GluParams& p, GpuContext& g);

}  // namespace k3
