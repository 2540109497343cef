// cache_pool_gpu.cu: the model's pool of bf16 cache pages (cache_pool_gpu.cuh).
#include "gpu/cache_pool_gpu.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "gpu/common_gpu.cuh"
#include "ops/mla_decode.h"

namespace k3::gpu {

namespace {

bool latent_paged(const ModelConfig& c) {
  return c.mla.kv_lora_rank == kMlaLatent && c.mla.d_rope == kMlaRope;
}
bool index_paged(const ModelConfig& c, int l) {
  return c.layer_attn[size_t(l)] == AttnKind::dsa && c.dsa.d_head % 16 == 0 && c.dsa.d_head <= 128;
}

// One thread per element of the rows (consecutive threads: consecutive columns of a row).
__global__ void page_store_kernel(PageStore p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n_rows * p.width) return;
  const int64_t r = i / p.width;
  const int col = int(i % p.width);
  const int64_t s = p.pos ? p.pos[r] : r;
  const int64_t t = p.row_seq ? p.row_seq[r] : 0;
  const int64_t page = p.table[t * p.max_pages + s / kCachePage];
  p.pages[(page * kCachePage + s % kCachePage) * p.width + col] =
      __bfloat16_as_ushort(__float2bfloat16_rn(p.src[i]));
}

}  // namespace

bool CachePoolGpu::wanted(const ModelConfig& cfg) {
  for (int l = 0; l < cfg.n_layer; ++l)
    if (cfg.layer_attn[size_t(l)] != AttnKind::kda && (latent_paged(cfg) || index_paged(cfg, l))) return true;
  return false;
}

CachePoolGpu::CachePoolGpu(const ModelConfig& cfg) : layers_(size_t(cfg.n_layer)) {
  for (int l = 0; l < cfg.n_layer; ++l) {
    if (cfg.layer_attn[size_t(l)] == AttnKind::kda) continue;
    CachePagesGpu& a = layers_[size_t(l)];
    a.d_latent = latent_paged(cfg) ? int(cfg.mla.d_latent()) : 0;
    a.d_index = index_paged(cfg, l) ? cfg.dsa.d_head : 0;
  }
}

CachePoolGpu::~CachePoolGpu() {
  for (CachePagesGpu& a : layers_) cudaFree(a.latent), cudaFree(a.index);
}

int64_t CachePoolGpu::page_bytes() const {
  int64_t b = 0;
  for (const CachePagesGpu& a : layers_) b += int64_t(kCachePage) * (a.d_latent + a.d_index) * 2;
  return b;
}

Status CachePoolGpu::grow(int64_t cap) {
  if (cap > int64_t(INT32_MAX) / kCachePage)
    return error(Code::out_of_range, "cache pool: " + std::to_string(cap) + " pages exceed the page ids");
  // The old pages may still be read by queued work, and are copied: the device must be idle.
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<CachePagesGpu> next = layers_;
  auto regrow = [&](uint16_t** p, uint16_t* old, int width) -> Status {
    if (width == 0) return ok_status();
    const size_t per = size_t(kCachePage) * size_t(width) * 2;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(p), per * size_t(cap));
    if (e != cudaSuccess) {
      cudaGetLastError();
      *p = nullptr;
      return error(Code::out_of_memory, "cache pool: cannot grow to " + std::to_string(cap) + " pages of " +
                                            std::to_string(per) + " bytes: " + cudaGetErrorString(e));
    }
    if (cap_ > 0) K3_CUDA_CHECK(cudaMemcpy(*p, old, per * size_t(cap_), cudaMemcpyDeviceToDevice));
    return ok_status();
  };
  Status s;
  for (size_t l = 0; l < layers_.size() && s.ok(); ++l) {
    s = regrow(&next[l].latent, layers_[l].latent, layers_[l].d_latent);
    if (s.ok()) s = regrow(&next[l].index, layers_[l].index, layers_[l].d_index);
  }
  if (!s.ok()) {  // keep the old pool whole
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (next[l].latent != layers_[l].latent) cudaFree(next[l].latent);
      if (next[l].index != layers_[l].index) cudaFree(next[l].index);
    }
    return s;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {  // in place: states hold pointers to these entries
    cudaFree(layers_[l].latent), cudaFree(layers_[l].index);
    layers_[l].latent = next[l].latent, layers_[l].index = next[l].index, layers_[l].n_pages = cap;
  }
  for (int64_t j = cap - 1; j >= cap_; --j) free_.push_back(int32_t(j));  // lowest ids handed out first
  cap_ = cap;
  return ok_status();
}

Status CachePoolGpu::take(int64_t n, std::vector<int32_t>* pages) {
  if (n <= 0) return ok_status();
  if (int64_t(free_.size()) < n)
    K3_RETURN_IF_ERROR(grow(std::max(2 * cap_, cap_ + n - int64_t(free_.size()))));
  for (int64_t i = 0; i < n; ++i) pages->push_back(free_.back()), free_.pop_back();
  return ok_status();
}

void CachePoolGpu::give(const std::vector<int32_t>& pages) {
  free_.insert(free_.end(), pages.rbegin(), pages.rend());
}

void page_store(const PageStore& p, cudaStream_t stream) {
  if (p.n_rows <= 0 || !p.pages) return;
  page_store_kernel<<<blocks_for(p.n_rows * p.width), kThreads, 0, stream>>>(p);
}

}  // namespace k3::gpu
