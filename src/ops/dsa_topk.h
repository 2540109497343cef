// dsa_topk.h: causal top-k of the DSA index scores (MODEL.md §6), decode and prefill, exact.
//
//   row i sees n_i positions: n_i = row_len[i] (decode: one query per sequence), or len0 + i (prefill: query
//   i of one sequence at position len0 - 1 + i, so it sees len0 + i positions)
//   sel[i, :] = 0, 1, .., n_i - 1, then -1                                         if n_i <= topk
//             = the topk positions s < n_i with the largest score[i, s], ties -> lower s, ascending   else
// Ties compare the fp32 values (so -0.0 == +0.0, as the CPU's partial_sort does); scores must not be NaN.
// Shapes: score fp32 [n_row, ld] (only s < n_i is read), sel int32 [n_row, topk], row_len int32 [n_row].
//
// The CUDA backend is a radix select on order-preserving 32-bit keys (sign-flipped float bits; -0 folded to
// +0), 4 passes of 8 bits, then one ordered compaction: s is selected iff key > T, or key == T and fewer
// than `need` equal keys precede it, and its output slot is (#greater before s) + min(#equal before s, need).
// A row is split over a thread-block cluster of up to 16 CTAs (8 where the device refuses the non-portable
// size; each CTA's histograms pushed into its peers' shared memory, counted on mbarriers; 1024-thread CTAs
// where the rows are few and long), each CTA's chunk of up to 16384 scores staged once in shared memory; one
// launch, no host decision on device data (CUDA-graph safe); max_len only sizes the cluster.
// DsaTopkKernel::sample is one CTA a row instead: a bound from 4096 evenly spaced scores, one read of the row
// keeping the keys above it (about 4096, in position order, in shared memory), and the same radix select over
// those alone; where they are fewer than topk or more than 8192 (many equal scores), over the whole row
// (dsa_topk_sample_cuda.cu). topk <= kDsaTopkSampleMaxK. The automatic choice takes it for batches whose rows
// fill a quarter of the SMs at lengths above 16K (K3_DSA_TOPK_SAMPLE=1 / 0: always / never); the cluster
// kernel otherwise.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

enum class DsaTopkKernel { automatic, cluster, sample };
constexpr int kDsaTopkSampleMaxK = 2048;

struct DsaTopkParams {
  int n_row = 0;
  int topk = 0;                      // >= 1
  int64_t ld = 0;                    // score row stride >= every n_i
  const float* score = nullptr;      // [n_row, ld]
  const int32_t* row_len = nullptr;  // [n_row]; nullptr: n_i = len0 + i
  int64_t len0 = 0;
  int64_t max_len = 0;     // host bound on every n_i (<= ld)
  int32_t* sel = nullptr;  // [n_row, topk]
  int cluster = 0;         // cuda: CTAs per row (1..16, clamped to the device's limit), 0 = from max_len
  DsaTopkKernel kernel = DsaTopkKernel::automatic;  // cuda: which kernel (cluster > 0: the cluster kernel)
};

// Shape checks (no pointer is dereferenced).
Status dsa_topk_check(const DsaTopkParams& p);
// Plain reference on host pointers: partial_sort with (score desc, position asc), then ascending.
void dsa_topk_ref(const DsaTopkParams& p);
// CUDA (device pointers, asynchronous on g.stream, no workspace).
void dsa_topk_cuda(const DsaTopkParams& p, GpuContext& g);

}  // namespace k3
