// moe_experts.h: the routed experts of a MoE layer with MXFP4 weights, gathered and weighted
// (MODEL.md §8.2 Stable LatentMoE: y = bf16(sum_j w_j fp32(E_{sel_j}(z))); §9 MXFP4).
//
//   for every token t and slot j (e = sel[t, j]):
//     g = bf16(w1_e z_t)   u = bf16(w3_e z_t)          [d_ff]   fp32 accumulation
//     h = bf16(act(g, u))                              [d_ff]   SiTU (beta1, beta2) or SiLU, fp32 inside
//     o_j = bf16(w2_e h)                               [d_in]
//   y[t] = bf16(sum_j wt[t, j] * o_j)                  [d_in]   fp32 sum in slot order j = 0 .. k-1
//
// These are the bf16-mode rounding points of the CPU model (model/moe.cpp + model/ffn.cpp); z is taken as
// bf16(z) (the latent down-projection's rounding point). MXFP4 weights keep the checkpoint layout per
// expert (w packed [rows, cols/2], low nibble = even column; E8M0 scales [rows, cols/32], < 255), reached
// through a table of per-expert pointers, so no copy of the experts is made.
//
// CUDA paths (both graph-capture safe: the routing stays on the device, launch shapes depend only on
// n_tok, k, n_expert and the dimensions; scratch is the caller's):
//   decode  (n_tok <= 8, and any n_tok <= kMoeDecodeMaxTok for bench variants; moe_experts_f16_cuda.cu): a
//           byte stream. Rows (t, j) sorted by expert into tiles of 2 (the sort also tabulates each tile's
//           expert and rows); a block of 4 warps owns
//           (tile, 16 neurons: gate and up rows together, or 32 down rows) and its warps split the reduction,
//           each streaming 16-byte loads of 32 MXFP4 weights (one scale group) per lane, 2 chunks ahead;
//           nibbles become e4m3 bytes by shifts and masks and byte pairs f16 pairs in one conversion (exact:
//           e2m1 x 2^-6), MMA m16n8k16 f16 whose 8 columns are (group of 32, token), so each lane's
//           accumulators are one scale group's sums, scaled by 2^(e - 127) in fp32. Activations (z, then h)
//           go in as per-group power-of-two-scaled f16 images (exact down to 2^28 below a group's largest).
//           Six launches (the sort, z's image, gate / up, h's image, down, the combine) as one chain of
//           programmatic dependent launches (unless K3_MOE_PDL=0): each kernel's blocks resident before the
//           one before it ends, the down kernel's first weight loads under gate / up's tail. From 9 to
//           kMoeDecodeMaxTok tokens, and at every size with K3_MOE_F16=0: the bf16 decode kernels of
//           moe_experts_cuda.cu (tiles of 8 rows, which read an expert with many rows fewer times; nibble
//           pairs to bf16 times the scale: the decode default before session 22).
//   prefill: rows (t, j) counting-sorted by expert on the device; a grouped GEMM whose blocks map to
//           (expert, row tile, neuron tile); SiTU fused after gate/up; the down GEMM writes each row back to
//           its (t, j) slot; a last pass sums the slots in order. Two kernels:
//           wgmma (d_in and d_ff multiples of 128): tiles of <= 128 rows (an expert's rows split evenly),
//             2 warpgroups of 64 neurons; MXFP4 decoded into the A registers of warpgroup MMAs (m64nNk16,
//             N = the tile's rows rounded up to 16) whose B operand is the tile's activations, staged in
//             shared memory by a 4-stage cp.async ring;
//           mma (any shape, or path = prefill_mma): 64-row tiles, a byte -> bf16x2 table in shared memory,
//             mma.sync m16n8k16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

// One expert's MXFP4 matrices (device pointers for the CUDA backend).
struct MoeExpertPtrs {
  const uint8_t* w1 = nullptr;  // gate [d_ff, d_in/2]   scale s1 [d_ff, d_in/32]
  const uint8_t* s1 = nullptr;
  const uint8_t* w3 = nullptr;  // up   [d_ff, d_in/2]   scale s3 [d_ff, d_in/32]
  const uint8_t* s3 = nullptr;
  const uint8_t* w2 = nullptr;  // down [d_in, d_ff/2]   scale s2 [d_in, d_ff/32]
  const uint8_t* s2 = nullptr;
};

enum class MoeAct : uint8_t { silu, situ };
enum class MoePath : uint8_t { automatic, decode, prefill, prefill_mma };  // prefill_mma: never the wgmma kernel

constexpr int kMoeDecodeMaxTok = 64;
constexpr int kMoeMaxExpert = 4096;  // the device sort keeps 2 x n_expert ints in shared memory

struct MoeExpertsParams {
  int64_t n_tok = 0;
  int n_expert = 0, k = 0;            // k = n_expert_used
  int d_in = 0, d_ff = 0;             // multiples of 32
  const float* z = nullptr;           // [n_tok, d_in], row stride ldz (0: d_in); used as bf16(z)
  int64_t ldz = 0;
  const int32_t* sel = nullptr;       // [n_tok, k] expert ids in [0, n_expert)
  const float* wt = nullptr;          // [n_tok, k]
  const MoeExpertPtrs* experts = nullptr;  // [n_expert]
  MoeAct act = MoeAct::situ;
  float beta1 = 4.0f, beta2 = 25.0f;  // SiTU; beta2 <= 0: b = u
  float* y = nullptr;                 // [n_tok, d_in], row stride ldy (0: d_in)
  int64_t ldy = 0;
  // CUDA only: device scratch of moe_experts_scratch_bytes(*this) bytes (256-byte aligned)
  void* scratch = nullptr;
  MoePath path = MoePath::automatic;
};

Status moe_experts_check(const MoeExpertsParams& p);
size_t moe_experts_scratch_bytes(const MoeExpertsParams& p);

// Plain reference: weights decoded exactly, fp64 dot products, the rounding points above.
void moe_experts_ref(const MoeExpertsParams& p);
// CPU: the bf16 CUDA kernels' algorithm on the host (sort, tiles, permuted k, table decode;
// moe_experts_layout.h), single-threaded; it checks those rules without a GPU (the model's CPU path is
// model/moe.cpp). The f16 decode path's bit rules are checked one by one in tests/cpp/test_moe_layout.cpp.
void moe_experts_cpu(const MoeExpertsParams& p);
// CUDA (core/gpu.h): device pointers (the experts table too), same contract.
void moe_experts_cuda(const MoeExpertsParams& p, GpuContext& g);

}  // namespace k3
