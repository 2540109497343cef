// state_gpu.cu: per-sequence state on the device (model_gpu.h GpuSeqState), the twin of model/state.cpp.
//
//   KDA layers: S [H, K, V] and the conv window [3, W-1, H*K], all layers in one allocation, zeroed at start;
//               the window is bf16 (conv16) when the fast kernels run (bf16 mode, K = V = 128, W = 4; exact,
//               as the pre-conv rows are a bf16 rounding point), fp32 otherwise (or with K3_KDA_FAST=0).
//   MLA layers: latent rows [cap, d_latent] (+ DSA index keys [cap, Di]), grown by doubling before a call;
//               where the shapes fit the tensor-core kernels also their bf16 values in pages of the model's
//               pool (cache_pool_gpu.cuh), which those kernels read (mla_gpu.cu, dsa_gpu.cu)
// Copies to and from a host SeqState use the same layouts, so a sequence can move between CPU and GPU.
#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/env.h"
#include "gpu/common_gpu.cuh"
#include "gpu/model_gpu.h"
#include "gpu/model_impl_gpu.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

namespace k3::gpu {

namespace {

int64_t kda_s_floats(const ModelConfig& c) {
  return int64_t(c.kda.n_head) * c.kda.d_head * c.kda.d_head;
}
int64_t kda_conv_floats(const ModelConfig& c) {
  return 3 * int64_t(c.kda.conv_size - 1) * c.kda.n_head * c.kda.d_head;
}
// (ModelConfig::n_layers_of lives in libk3; counted here so libk3_cuda needs nothing more from it.)
int64_t n_kda_layers(const ModelConfig& c) {
  int64_t n = 0;
  for (AttnKind k : c.layer_attn) n += k == AttnKind::kda;
  return n;
}
int64_t index_width(const ModelConfig& c, int layer) {
  return c.layer_attn[size_t(layer)] == AttnKind::dsa ? c.dsa.d_head : 0;
}
// The fast KDA kernels (ops/kda_fast.h) serve bf16 mode with K = V = 128 and a conv of width 4, the default
// there (K3_KDA_FAST=0: the generic path); src/gpu/kda_fast_gpu.cu.
bool kda_fast(const ModelConfig& c, Precision p) {
  return p == Precision::bf16 && c.kda.d_head == 128 && c.kda.conv_size == 4 &&
         env_switch("K3_KDA_FAST", true);
}
// Bytes of one KDA layer's state: S, then the window (bf16 or fp32), rounded up to 256.
int64_t kda_layer_bytes(const ModelConfig& c, bool fast) {
  const int64_t b = kda_s_floats(c) * 4 + kda_conv_floats(c) * (fast ? 2 : 4);
  return (b + 255) / 256 * 256;
}
bool has_conv16(const std::vector<KdaStateGpu>& kda) {
  for (const KdaStateGpu& k : kda)
    if (k.conv16) return true;
  return false;
}

}  // namespace

GpuSeqState::~GpuSeqState() {
  cudaFree(kda_block_);
  for (MlaStateGpu& m : mla) cudaFree(m.latent), cudaFree(m.index_k);
  if (pool_) pool_->give(pages_);
}

Result<std::unique_ptr<GpuSeqState>> GpuModel::new_state() {
  K3_CUDA_CHECK(cudaSetDevice(device_));
  std::unique_ptr<GpuSeqState> s(new GpuSeqState(cfg_));
  const int L = cfg_.n_layer;
  s->kda.assign(size_t(L), {});
  s->mla.assign(size_t(L), {});
  const bool fast = kda_fast(cfg_, opt_.precision);
  if (!impl_->pool && CachePoolGpu::wanted(cfg_)) impl_->pool = std::make_shared<CachePoolGpu>(cfg_);
  s->pool_ = impl_->pool;
  if (s->pool_)
    for (int l = 0; l < L; ++l)
      if (cfg_.layer_attn[size_t(l)] != AttnKind::kda)
        s->mla[size_t(l)].paged = &s->pool_->layer(l), s->mla[size_t(l)].table = &s->pages_;
  const int64_t per = kda_layer_bytes(cfg_, fast);
  const int64_t n_kda = n_kda_layers(cfg_);
  if (n_kda > 0) {
    K3_CUDA_CHECK(cudaMalloc(&s->kda_block_, size_t(per * n_kda)));
    char* q = reinterpret_cast<char*>(s->kda_block_);
    for (int l = 0; l < L; ++l)
      if (cfg_.layer_attn[size_t(l)] == AttnKind::kda) {
        KdaStateGpu& k = s->kda[size_t(l)];
        k.S = reinterpret_cast<float*>(q);
        char* w = q + kda_s_floats(cfg_) * 4;
        if (fast)
          k.conv16 = reinterpret_cast<uint16_t*>(w);
        else
          k.conv = reinterpret_cast<float*>(w);
        q += per;
      }
  }
  K3_RETURN_IF_ERROR(s->reset());
  return Result<std::unique_ptr<GpuSeqState>>(std::move(s));
}

Status GpuSeqState::reset() {
  n_past_ = 0;
  const int64_t n_kda = n_kda_layers(*cfg_);
  if (kda_block_)
    K3_CUDA_CHECK(cudaMemset(kda_block_, 0, size_t(kda_layer_bytes(*cfg_, has_conv16(kda)) * n_kda)));
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  return ok_status();
}

Status GpuSeqState::reserve(int64_t n) {
  const int64_t dl = cfg_->mla.d_latent();
  if (pool_)
    K3_RETURN_IF_ERROR(pool_->take((n + kCachePage - 1) / kCachePage - int64_t(pages_.size()), &pages_));
  for (int l = 0; l < cfg_->n_layer; ++l) {
    if (cfg_->layer_attn[size_t(l)] == AttnKind::kda) continue;
    MlaStateGpu& m = mla[size_t(l)];
    if (m.cap >= n) continue;
    const int64_t cap = std::max({n, 2 * m.cap, int64_t(64)}), di = index_width(*cfg_, l);
    float *lat = nullptr, *idx = nullptr;
    K3_CUDA_CHECK(
        cudaDeviceSynchronize());  // the old rows are final (the model's stream is idle between calls)
    K3_CUDA_CHECK(cudaMalloc(&lat, size_t(cap * dl) * 4));
    if (n_past_ > 0)
      K3_CUDA_CHECK(cudaMemcpy(lat, m.latent, size_t(n_past_ * dl) * 4, cudaMemcpyDeviceToDevice));
    if (di > 0) {
      K3_CUDA_CHECK(cudaMalloc(&idx, size_t(cap * di) * 4));
      if (n_past_ > 0)
        K3_CUDA_CHECK(cudaMemcpy(idx, m.index_k, size_t(n_past_ * di) * 4, cudaMemcpyDeviceToDevice));
    }
    cudaFree(m.latent);
    cudaFree(m.index_k);
    m.latent = lat, m.index_k = idx, m.cap = cap;
  }
  return ok_status();
}

int64_t GpuSeqState::bytes() const {
  int64_t n = kda_layer_bytes(*cfg_, has_conv16(kda)) * n_kda_layers(*cfg_);
  for (int l = 0; l < cfg_->n_layer; ++l)
    if (cfg_->layer_attn[size_t(l)] != AttnKind::kda)
      n += mla[size_t(l)].cap * (cfg_->mla.d_latent() + index_width(*cfg_, l)) * 4;
  if (pool_) n += int64_t(pages_.size()) * pool_->page_bytes();
  return n;
}

Status GpuSeqState::download(SeqState* host) const {
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  const int64_t dl = cfg_->mla.d_latent();
  for (int l = 0; l < cfg_->n_layer; ++l) {
    if (cfg_->layer_attn[size_t(l)] == AttnKind::kda) {
      KdaState& k = host->kda[size_t(l)];
      k.S.resize(size_t(kda_s_floats(*cfg_)));
      k.conv.resize(size_t(kda_conv_floats(*cfg_)));
      K3_CUDA_CHECK(cudaMemcpy(k.S.data(), kda[size_t(l)].S, k.S.size() * 4, cudaMemcpyDeviceToHost));
      if (const uint16_t* c16 = kda[size_t(l)].conv16) {  // bf16 window: widened exactly
        std::vector<uint16_t> h(k.conv.size());
        K3_CUDA_CHECK(cudaMemcpy(h.data(), c16, h.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < h.size(); ++i) k.conv[i] = bf16_to_f32(h[i]);
      } else {
        K3_CUDA_CHECK(
            cudaMemcpy(k.conv.data(), kda[size_t(l)].conv, k.conv.size() * 4, cudaMemcpyDeviceToHost));
      }
      continue;
    }
    MlaState& m = host->mla[size_t(l)];
    const int64_t di = index_width(*cfg_, l);
    m.latent.resize(size_t(n_past_ * dl));
    m.index_k.resize(size_t(n_past_ * di));
    if (n_past_ == 0) continue;
    K3_CUDA_CHECK(
        cudaMemcpy(m.latent.data(), mla[size_t(l)].latent, m.latent.size() * 4, cudaMemcpyDeviceToHost));
    if (di > 0)
      K3_CUDA_CHECK(
          cudaMemcpy(m.index_k.data(), mla[size_t(l)].index_k, m.index_k.size() * 4, cudaMemcpyDeviceToHost));
  }
  host->set_n_past(n_past_);
  return ok_status();
}

Status GpuSeqState::upload(const SeqState& host) {
  const int64_t n = host.n_past(), dl = cfg_->mla.d_latent();
  n_past_ = 0;  // reserve copies nothing
  K3_RETURN_IF_ERROR(reserve(n));
  for (int l = 0; l < cfg_->n_layer; ++l) {
    if (cfg_->layer_attn[size_t(l)] == AttnKind::kda) {
      const KdaState& k = host.kda[size_t(l)];
      if (int64_t(k.S.size()) != kda_s_floats(*cfg_) || int64_t(k.conv.size()) != kda_conv_floats(*cfg_))
        return error(Code::invalid_argument,
                     "upload: KDA state of layer " + std::to_string(l) + " has the wrong size");
      K3_CUDA_CHECK(cudaMemcpy(kda[size_t(l)].S, k.S.data(), k.S.size() * 4, cudaMemcpyHostToDevice));
      if (uint16_t* c16 = kda[size_t(l)].conv16) {  // a bf16-mode CPU state holds bf16 values: exact
        std::vector<uint16_t> h(k.conv.size());
        for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(k.conv[i]);
        K3_CUDA_CHECK(cudaMemcpy(c16, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
      } else {
        K3_CUDA_CHECK(
            cudaMemcpy(kda[size_t(l)].conv, k.conv.data(), k.conv.size() * 4, cudaMemcpyHostToDevice));
      }
      continue;
    }
    const MlaState& m = host.mla[size_t(l)];
    const int64_t di = index_width(*cfg_, l);
    if (int64_t(m.latent.size()) != n * dl || int64_t(m.index_k.size()) != n * di)
      return error(Code::invalid_argument,
                   "upload: MLA cache of layer " + std::to_string(l) + " has the wrong size");
    if (n == 0) continue;
    K3_CUDA_CHECK(
        cudaMemcpy(mla[size_t(l)].latent, m.latent.data(), m.latent.size() * 4, cudaMemcpyHostToDevice));
    if (di > 0)
      K3_CUDA_CHECK(
          cudaMemcpy(mla[size_t(l)].index_k, m.index_k.data(), m.index_k.size() * 4, cudaMemcpyHostToDevice));
  }
  K3_RETURN_IF_ERROR(store_pages(n));
  n_past_ = n;
  return ok_status();
}

Status GpuSeqState::store_pages(int64_t n) {
  if (!pool_ || n <= 0) return ok_status();
  int32_t* table = nullptr;
  K3_CUDA_CHECK(cudaMalloc(&table, pages_.size() * 4));
  cudaError_t e = cudaMemcpy(table, pages_.data(), pages_.size() * 4, cudaMemcpyHostToDevice);
  for (int l = 0; l < cfg_->n_layer && e == cudaSuccess; ++l) {
    const MlaStateGpu& m = mla[size_t(l)];
    if (!m.paged) continue;
    PageStore p;
    p.table = table, p.max_pages = int(pages_.size()), p.n_rows = n;
    p.pages = m.paged->latent, p.width = m.paged->d_latent, p.src = m.latent;
    page_store(p, nullptr);
    p.pages = m.paged->index, p.width = m.paged->d_index, p.src = m.index_k;
    page_store(p, nullptr);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  cudaFree(table);
  if (e != cudaSuccess)
    return error(Code::internal, std::string("storing cache pages: ") + cudaGetErrorString(e));
  return launch_status("storing cache pages");
}

}  // namespace k3::gpu
