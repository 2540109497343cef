// state_pages.cpp: SeqState <-> pool pages (state_pages.h).
#include "cache/state_pages.h"

#include <algorithm>
#include <cstring>

namespace k3 {

StateLayout StateLayout::make(const ModelConfig& cfg, int block_tokens) {
  StateLayout L;
  L.block_tokens = block_tokens;
  for (int l = 0; l < cfg.n_layer; ++l) {
    AttnKind k = cfg.layer_attn[size_t(l)];
    if (k == AttnKind::kda)
      L.kda_layers.push_back(l);
    else
      L.attn_layers.push_back(l);
    if (k == AttnKind::dsa) L.dsa_layers.push_back(l);
  }
  L.d_latent = cfg.mla.d_latent();
  L.d_index = cfg.dsa.enabled ? cfg.dsa.d_head : 0;
  L.kda_heads = cfg.kda.n_head;
  L.kda_d = cfg.kda.d_head;
  L.conv_rows = std::max(cfg.kda.conv_size - 1, 0);
  L.kda_head_floats = int64_t(L.kda_d) * L.kda_d + 3 * int64_t(L.conv_rows) * L.kda_d;
  L.page_bytes = std::max<int64_t>(int64_t(block_tokens) * std::max(L.d_latent, L.d_index) * 4, 64);
  return L;
}

int StateLayout::pages_per_kda_group() const {
  const int64_t bytes = kda_heads * kda_head_floats * 4;
  return int((bytes + page_bytes - 1) / page_bytes);
}

namespace {

// Byte-wise copy of `n` floats at float offset `off` of the concatenated pages <-> `buf`.
template <class Pool, class Buf>
void page_span_io(Pool& pool, std::span<const PageId> pages, PageKind kind, int64_t page_bytes, int64_t off,
                  Buf* buf, int64_t n, bool to_pages) {
  int64_t byte = off * 4, left = n * 4;
  auto* b = reinterpret_cast<std::conditional_t<std::is_const_v<Buf>, const std::byte, std::byte>*>(buf);
  while (left > 0) {
    const size_t pi = size_t(byte / page_bytes);
    const int64_t in = byte % page_bytes, len = std::min(left, page_bytes - in);
    K3_ASSERT(pi < pages.size());
    auto page = pool.data(pages[pi], kind);
    if constexpr (!std::is_const_v<Pool>) {
      if (to_pages)
        std::memcpy(page.data() + in, b, size_t(len));
      else
        std::memcpy((void*)b, page.data() + in, size_t(len));
    } else {
      std::memcpy((void*)b, page.data() + in, size_t(len));
    }
    byte += len, left -= len, b += len;
  }
}

}  // namespace

void store_rows(PagePool& pool, const StateLayout& L, std::span<const PageId> pages, int64_t row0,
                const SeqState& st, int64_t pos0, int64_t n) {
  K3_ASSERT(row0 + n <= L.block_tokens && int(pages.size()) == L.pages_per_block());
  for (size_t i = 0; i < L.attn_layers.size(); ++i) {
    const std::vector<float>& lat = st.mla[size_t(L.attn_layers[i])].latent;
    K3_ASSERT(int64_t(lat.size()) >= (pos0 + n) * L.d_latent);
    auto page = pool.data(pages[i], PageKind::mla_latent);
    std::memcpy(page.data() + row0 * L.d_latent * 4, &lat[size_t(pos0 * L.d_latent)],
                size_t(n * L.d_latent * 4));
  }
  for (size_t i = 0; i < L.dsa_layers.size(); ++i) {
    const std::vector<float>& ik = st.mla[size_t(L.dsa_layers[i])].index_k;
    K3_ASSERT(int64_t(ik.size()) >= (pos0 + n) * L.d_index);
    auto page = pool.data(pages[L.attn_layers.size() + i], PageKind::dsa_index);
    std::memcpy(page.data() + row0 * L.d_index * 4, &ik[size_t(pos0 * L.d_index)], size_t(n * L.d_index * 4));
  }
}

void load_rows(const PagePool& pool, const StateLayout& L, std::span<const PageId> pages, int64_t row0,
               SeqState& st, int64_t n) {
  K3_ASSERT(row0 + n <= L.block_tokens && int(pages.size()) == L.pages_per_block());
  for (size_t i = 0; i < L.attn_layers.size(); ++i) {
    std::vector<float>& lat = st.mla[size_t(L.attn_layers[i])].latent;
    auto page = pool.data(pages[i], PageKind::mla_latent);
    const float* src = reinterpret_cast<const float*>(page.data()) + row0 * L.d_latent;
    lat.insert(lat.end(), src, src + n * L.d_latent);
  }
  for (size_t i = 0; i < L.dsa_layers.size(); ++i) {
    std::vector<float>& ik = st.mla[size_t(L.dsa_layers[i])].index_k;
    auto page = pool.data(pages[L.attn_layers.size() + i], PageKind::dsa_index);
    const float* src = reinterpret_cast<const float*>(page.data()) + row0 * L.d_index;
    ik.insert(ik.end(), src, src + n * L.d_index);
  }
}

void copy_rows(PagePool& pool, const StateLayout& L, std::span<const PageId> src, std::span<const PageId> dst,
               int64_t n) {
  for (size_t i = 0; i < src.size(); ++i) {
    const bool lat = i < L.attn_layers.size();
    const PageKind kind = lat ? PageKind::mla_latent : PageKind::dsa_index;
    const int64_t bytes = n * (lat ? L.d_latent : L.d_index) * 4;
    std::memcpy(pool.data(dst[i], kind).data(), pool.data(src[i], kind).data(), size_t(bytes));
  }
}

void store_kda(PagePool& pool, const StateLayout& L, int g, std::span<const PageId> pages,
               const SeqState& st) {
  const KdaState& s = st.kda[size_t(L.kda_layers[size_t(g)])];
  const int64_t H = L.kda_heads, K = L.kda_d, R = L.conv_rows;
  int64_t off = 0;
  for (int64_t h = 0; h < H; ++h) {
    page_span_io(pool, pages, PageKind::kda_state, L.page_bytes, off, &s.S[size_t(h * K * K)], K * K, true);
    off += K * K;
    for (int64_t r = 0; r < 3 * R; ++r, off += K)
      page_span_io(pool, pages, PageKind::kda_state, L.page_bytes, off, &s.conv[size_t((r * H + h) * K)], K,
                   true);
  }
}

void load_kda(const PagePool& pool, const StateLayout& L, int g, std::span<const PageId> pages,
              SeqState& st) {
  KdaState& s = st.kda[size_t(L.kda_layers[size_t(g)])];
  const int64_t H = L.kda_heads, K = L.kda_d, R = L.conv_rows;
  int64_t off = 0;
  for (int64_t h = 0; h < H; ++h) {
    page_span_io(pool, pages, PageKind::kda_state, L.page_bytes, off, &s.S[size_t(h * K * K)], K * K, false);
    off += K * K;
    for (int64_t r = 0; r < 3 * R; ++r, off += K)
      page_span_io(pool, pages, PageKind::kda_state, L.page_bytes, off, &s.conv[size_t((r * H + h) * K)], K,
                   false);
  }
}

}  // namespace k3
