// linear.h: y = W x for every weight dtype the checkpoints hold (MODEL.md §3, §9).
//
//   y[t, o] = sum_i x[t, i] * W[o, i]        x: [n_tok, in] fp32, y: [n_tok, out] fp32, fp32 accumulation
//
// W is bf16, f16, f32 or fp8 e4m3 [out, in], or MXFP4 (weight_packed u8 [out, in/2], low nibble = even
// column; weight_scale E8M0 [out, in/32]) decoded inside the inner loop, never expanded to a full copy.
// LinearParams::round_bf16 rounds y to bf16 (kept in fp32) after the sum: the model's rounding point, fused
// into the GPU's decode GEMV.
//
// LinearParams adds row strides (x and y rows may be views into wider buffers) and the input precision:
// Precision::bf16 promises every x value is already bf16-rounded (round_bf16_inplace), which lets the fast
// path use vdpbf16ps (exact products, fp32 accumulation); Precision::fp32 keeps x exact (W is decoded to
// fp32 in registers and FMA'd in fp32). MXFP4 scale bytes must be < 255 (the loader rejects 255; the
// kernels assert it in debug builds): mxfp4_find_bad_scale() is the check.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/gpu.h"
#include "ops/precision.h"

namespace k3 {

class ThreadPool;

struct LinearWeight {
  DType dtype = DType::bf16;        // u8 means MXFP4 (packed) with `scale`
  int64_t out = 0, in = 0;
  const void* w = nullptr;          // [out, in] (MXFP4: [out, in/2] bytes)
  const uint8_t* scale = nullptr;   // MXFP4 only: [out, in/32] E8M0
  bool is_mxfp4() const { return scale != nullptr; }
};

struct LinearParams {
  int64_t n_tok = 0;
  const float* x = nullptr;  // [n_tok, in], row stride ldx (>= in)
  int64_t ldx = 0;           // 0 means in
  float* y = nullptr;        // [n_tok, out], row stride ldy (>= out)
  int64_t ldy = 0;           // 0 means out
  Precision x_precision = Precision::fp32;  // bf16: x values are bf16-rounded, the bf16 dot path is allowed
  bool round_bf16 = false;                  // y[t, o] = bf16(sum) (kept in fp32)
};

void linear_ref(const LinearWeight& W, const LinearParams& p);
void linear_cpu(const LinearWeight& W, const LinearParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): W.w / W.scale, p.x, p.y are device pointers; cuBLAS(Lt) for bf16/f16/f32 weights (fp32
// accumulation; TF32 only if g.allow_tf32), MXFP4 decoded in-kernel. x_precision bf16 allows bf16 tensor-core
// inputs (x exactly representable); fp32 keeps x exact.
void linear_cuda(const LinearWeight& W, const LinearParams& p, GpuContext& g);
// y_i = W_i x for i < n: n linear_cuda calls, every p[i] with the same x, ldx and n_tok (y, ldy, round_bf16
// may differ). At decode sizes (n_tok <= 8) weights of one dtype and `in` (at most 8) share one GEMV launch:
// the projections of one input (KDA q, k, v, beta, gate; FFN gate, up) stream as one matrix.
void linear_group_cuda(const LinearWeight* const* W, const LinearParams* p, int n, GpuContext& g);

// Index of the first scale byte equal to 255 in scale[0..n), or -1.
int64_t mxfp4_find_bad_scale(const uint8_t* scale, int64_t n);
// Decodes W[row, col0 .. col0+n) to fp32 with the fast path's decoder (tests compare it with a scalar one).
void linear_decode_row(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out);

// Plain reference: one output at a time, fp64 accumulation, weights decoded exactly.
void linear_ref(const LinearWeight& W, const float* x, float* y, int64_t n_tok);
// Fast CPU: blocked, SIMD (AVX-512 BF16 where present, detected at run time), threads over outputs.
void linear_cpu(const LinearWeight& W, const float* x, float* y, int64_t n_tok, ThreadPool* pool);

}  // namespace k3
