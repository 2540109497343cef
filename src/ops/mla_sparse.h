// mla_sparse.h: absorbed MLA decode restricted to the DSA-selected positions (MODEL.md §6, main attention).
//
//   for query i (one per sequence in decode; one sequence's queries in prefill, shared_table):
//   S_i      = { sel[i, j] : j < topk, sel[i, j] >= 0 }       (ascending, -1 padded at the end, |S_i| >= 1)
//   out[i,h] = sum_{s in S_i} softmax_s(scale * q[i, h, :] . row(i, s)) * c_s      (rows as in mla_decode.h)
// Shapes: q bf16 [n_q, n_head, 576], out fp32 [n_q, n_head, 512], sel int32 [n_q, topk], block_table
// [n_q or 1, max_pages], cache bf16 [n_pages, P, 576].
//
// CUDA: ops/mla_decode.h's tensor-core split-KV kernel (mma.sync) over each query's selected rows in place: a
// table kernel writes the physical cache row (page * P + slot) of every selection, and the decode kernel
// reads the cache as pages of one row through that table, with ctx_len = |S_i| and exact_p: the softmax
// weights keep 16 significant bits in P V (two bf16 pieces; fp32 in the reference and in model/mla.cpp's
// attention_cpu, whose rounding points the bf16 model must share). (With P rounded to bf16, the plain decode
// kernels' choice, the tiny-k3-mla top-8 DSA layer test missed its 1e-4 bound: moe_routed 1.48e-4,
// reproduced on the host by rounding attention_cpu's weights alone; two pieces pass it, decision gpu.7.) Cost
// per query: |S_i| * 1152 bytes read once, flat in the context. K3_MLA_SPARSE_GATHER=1 (read per call): the
// session-4 path, a gather of the rows into scratch first. Everything stays on the device (CUDA-graph safe);
// scratch = mla_sparse_scratch_bytes, and g.workspace serves mla_decode_cuda as usual.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

struct MlaSparseParams {
  int n_q = 0, n_head = 0;
  int topk = 0;
  const int32_t* sel = nullptr;  // [n_q, topk]
  int page_size = 0, max_pages = 0;
  int64_t n_pages = 0;
  const int32_t* block_table = nullptr;  // [n_q, max_pages], or [1, max_pages] when shared_table
  bool shared_table = false;
  const uint16_t* cache = nullptr;  // bf16 [n_pages, P, 576]
  const uint16_t* q = nullptr;      // bf16 [n_q, n_head, 576]
  float scale = 1.f;
  float* out = nullptr;     // [n_q, n_head, 512]
  void* scratch = nullptr;  // cuda: mla_sparse_scratch_bytes(n_q, topk)
  int n_split = 0;          // cuda: mla_decode's KV splits per query, 0 = its own choice
};

Status mla_sparse_check(const MlaSparseParams& p);
// fp64 reference (gathers on the host, then mla_decode_ref: unrounded softmax weights, the contract the
// CUDA op meets with exact_p); checks every selected position's page.
void mla_sparse_ref(const MlaSparseParams& p);
size_t mla_sparse_scratch_bytes(int n_q, int topk);
void mla_sparse_cuda(const MlaSparseParams& p, GpuContext& g);

}  // namespace k3
