// dsa_index.h: the DSA lightning-indexer scores over the paged index-key cache (MODEL.md §6), and the store
// of new index keys into that cache (bf16, or FP8 e4m3 with a per-token scale).
//
//   key cache, page j of P tokens:  bf16: k[P, Di] bf16                          (P * Di * 2 bytes)
//                                   fp8:  k8[P, Di] e4m3, then sc[P] fp32        (P * (Di + 4) bytes)
//                                         k_s = sc_s * k8_s; store: sc = max|k| / 448 (1 when k = 0),
//                                         k8 = e4m3_rne_satfinite(k / sc)
//   token s of sequence b lives in page block_table[b, s / P], slot s % P
//   I[i, s] = scale * sum_h w[i, h] * relu(q~[i, h, :] . k_s)        s < n_i, fp32 accumulation
//   q~ = bf16(q) (MODEL.md: q^I is bf16); q_exact: q itself (the CUDA kernel splits q = hi + lo into two bf16
//   products, error ~2^-16 relative), used where the CPU model keeps q in fp32.
// Queries: decode (ctx_len != nullptr): query b belongs to sequence b and sees n_b = ctx_len[b] tokens.
//          prefill (ctx_len == nullptr): every query belongs to sequence 0; query i sees n_past + i + 1.
// Only I[i, s < n_i] is written; score rows have stride ld >= every n_i.
// Shapes: q [n_q, Hi, Di], w [n_q, Hi] fp32; Di % 16 == 0, Di <= 128; 1 <= Hi <= 64.
//
// CUDA: tensor-core mma (bf16 m16n8k16; FP8 keys are widened to f16 in registers and q is scaled per head
// into [-1, 1] in f16, the scale folded into w). A CTA of 4 warps streams tiles of 64 keys of one sequence
// through shared memory (cp.async, 3 stages; one block-table read a tile where pages hold whole tiles); each
// warp keeps one query's q fragments in registers and scores its 16-key slices: keys are the M side, heads
// the N side, so the head sum is a per-lane sum plus two shuffles. Decode: one query per CTA, the context
// split over CTAs in whole waves of resident CTAs (1 to 4), the query's q staged in shared memory first.
// Prefill: 4 queries per CTA share every key tile. Contexts up to 2^30.
// The byte floor per call is sum over sequences of n * (Di * 2) bytes (bf16) or n * (Di + 4) (fp8).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

enum class DsaKeyFormat { bf16, fp8 };

struct DsaKeyCache {
  DsaKeyFormat fmt = DsaKeyFormat::bf16;
  int d_head = 0;     // Di
  int page_size = 0;  // P
  int max_pages = 0;  // block_table row length
  int64_t n_pages = 0;
  void* pages = nullptr;                 // n_pages * dsa_key_page_bytes(...)
  const int32_t* block_table = nullptr;  // [n_seq, max_pages]
};
size_t dsa_key_page_bytes(DsaKeyFormat fmt, int page_size, int d_head);

// Writes key rows k [n_tok, Di] (fp32, already bf16-rounded by the model in bf16 mode) into the cache: row t
// goes to sequence seq[t] (nullptr: 0) at position pos[t] (nullptr: pos0 + t).
struct DsaKeyStoreParams {
  DsaKeyCache cache;
  int n_tok = 0;
  const float* k = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  int64_t pos0 = 0;
};
Status dsa_key_store_check(const DsaKeyStoreParams& p);
void dsa_key_store_ref(const DsaKeyStoreParams& p);
void dsa_key_store_cuda(const DsaKeyStoreParams& p, GpuContext& g);

struct DsaIndexParams {
  DsaKeyCache cache;
  int n_head = 0;  // Hi
  int n_q = 0;
  const int32_t* ctx_len = nullptr;  // decode: [n_q]; nullptr: prefill
  int64_t n_past = 0;                // prefill
  int64_t max_ctx = 0;               // host bound on every n_i (<= max_pages * P and <= ld)
  const float* q = nullptr;          // [n_q, Hi, Di]
  const float* w = nullptr;          // [n_q, Hi]
  float scale = 1.f;
  bool q_exact = false;    // bf16 keys only
  float* score = nullptr;  // [n_q, ld]
  int64_t ld = 0;
  int n_split = 0;  // cuda decode: CTAs per query, 0 = chosen from max_ctx and the SMs
  int stages = 0;   // cuda: key tiles in flight + 1 (0 = 3; 6: a deeper ring, bf16 keys, Di = 128)
};
Status dsa_index_check(const DsaIndexParams& p);
// fp64 sums over the stored keys (fp8: sc * e4m3) and q~.
void dsa_index_ref(const DsaIndexParams& p);
void dsa_index_cuda(const DsaIndexParams& p, GpuContext& g);

// e4m3 helpers of the FP8 format (host): round-to-nearest-even, saturating to +-448.
uint8_t dsa_f32_to_e4m3(float x);

}  // namespace k3
