// cache_pool_gpu.cuh: the paged bf16 caches the tensor-core MLA / DSA kernels read, one pool per model.
//
//   page j of MLA layer l:  latent[l] + j * P * 576   bf16 rows [c | r]          (mla_decode.h, mla_sparse.h)
//                           index[l]  + j * P * Di    bf16 DSA index keys        (dsa_index.h, bf16 format)
//   position s of a sequence lives in page pages[s / P], slot s % P, in every MLA layer alike
//
// A sequence (GpuSeqState) takes page ids as its context grows and gives them back when it dies, so one
// launch can serve a batch of sequences through a block table of page ids (decode steps: mla_gpu.cu). The
// pool grows by doubling (a new allocation per layer array, the old pages copied; page ids stay valid), only
// between calls. The fp32 rows of MlaStateGpu stay the state of record (download / upload, fp32 mode, the
// generic kernels); the pages hold their bf16 values, exact in bf16 mode, where those rows are bf16 values.
// Internal to src/gpu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "k3/config.h"

namespace k3::gpu {

constexpr int kCachePage = 64;  // rows a page (the kernels' tile: one block-table read a 64-key tile)

// This layer's arrays (base pointers move when the pool grows; read them after GpuSeqState::reserve).
struct CachePagesGpu {
  uint16_t* latent = nullptr;  // [n_pages, P, d_latent] or null (shapes the MLA kernels do not serve)
  uint16_t* index = nullptr;   // [n_pages, P, d_index] or null (not a DSA layer, or Di they do not serve)
  int d_latent = 0, d_index = 0;
  int64_t n_pages = 0;  // the pool's page ids (every array's first dimension)
};

class CachePoolGpu {
 public:
  // Which arrays a config gets: latent pages where d_latent is the MLA kernels' 512 + 64; index pages on DSA
  // layers where Di % 16 == 0 and Di <= 128 (the indexer kernel's shapes). None: no pool (null).
  static bool wanted(const ModelConfig& cfg);
  explicit CachePoolGpu(const ModelConfig& cfg);
  ~CachePoolGpu();
  CachePoolGpu(const CachePoolGpu&) = delete;
  CachePoolGpu& operator=(const CachePoolGpu&) = delete;

  // Appends n page ids to *pages, growing the pool when too few are free (synchronizes the device then).
  Status take(int64_t n, std::vector<int32_t>* pages);
  // Returns page ids (their contents become garbage).
  void give(const std::vector<int32_t>& pages);
  const CachePagesGpu& layer(int l) const { return layers_[size_t(l)]; }
  int64_t page_bytes() const;  // every layer's arrays together, per page id

 private:
  Status grow(int64_t cap);
  std::vector<CachePagesGpu> layers_;  // [n_layer]; both null on KDA layers
  int64_t cap_ = 0;
  std::vector<int32_t> free_;
};

// pages[r] of rows [n_rows, width] (fp32 rows holding bf16 values in bf16 mode; rounded to nearest even
// otherwise): row r goes to the sequence of table row row_seq[r] at position pos[r]:
// dst[table[row_seq[r] * max_pages + pos[r] / P] * P + pos[r] % P, :] = bf16(src[r, :]).
// row_seq == nullptr: every row is table row 0's; pos == nullptr: position r.
struct PageStore {
  uint16_t* pages = nullptr;
  int width = 0;
  const int32_t* table = nullptr;  // device [n_table_rows, max_pages]
  int max_pages = 0;
  const int32_t* row_seq = nullptr;  // device [n_rows]
  const int32_t* pos = nullptr;      // device [n_rows]
  const float* src = nullptr;  // device [n_rows, width]
  int64_t n_rows = 0;
};
void page_store(const PageStore& p, cudaStream_t stream);

}  // namespace k3::gpu
