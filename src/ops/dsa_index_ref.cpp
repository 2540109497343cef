// dsa_index_ref.cpp: plain references of the DSA index-key store and index scores (dsa_index.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/dsa_index.h"

namespace k3 {
namespace {

Status check_cache(const DsaKeyCache& c, const char* op) {
  if (c.d_head < 16 || c.d_head > 128 || c.d_head % 16 != 0)
    return error(Code::unsupported, std::string(op) + ": index head dim " + std::to_string(c.d_head) +
                                        " (supported: multiples of 16 up to 128)");
  if (c.page_size < 1 || c.max_pages < 1 || c.n_pages < 1)
    return error(Code::invalid_argument, std::string(op) + ": page_size, max_pages, n_pages must be >= 1");
  if (c.fmt == DsaKeyFormat::fp8 && (size_t(c.page_size) * size_t(c.d_head + 4)) % 16 != 0)
    return error(Code::unsupported, std::string(op) + ": fp8 pages of " + std::to_string(c.page_size) +
                                        " tokens are not 16-byte aligned (page_size * (Di + 4) % 16 != 0)");
  if (!c.pages || !c.block_table)
    return error(Code::invalid_argument, std::string(op) + ": null cache pointer");
  return ok_status();
}

// Address of token s of sequence b: key bytes and (fp8) its scale.
const uint8_t* key_row(const DsaKeyCache& c, int b, int64_t s, const float** sc) {
  const int32_t page = c.block_table[size_t(b) * c.max_pages + size_t(s / c.page_size)];
  K3_ASSERT(page >= 0 && page < c.n_pages);
  const uint8_t* base =
      static_cast<const uint8_t*>(c.pages) + size_t(page) * dsa_key_page_bytes(c.fmt, c.page_size, c.d_head);
  const int64_t slot = s % c.page_size;
  if (c.fmt == DsaKeyFormat::bf16) return base + size_t(slot) * c.d_head * 2;
  *sc = reinterpret_cast<const float*>(base + size_t(c.page_size) * c.d_head) + slot;
  return base + size_t(slot) * c.d_head;
}

}  // namespace

size_t dsa_key_page_bytes(DsaKeyFormat fmt, int page_size, int d_head) {
  return size_t(page_size) * (fmt == DsaKeyFormat::bf16 ? size_t(d_head) * 2 : size_t(d_head) + 4);
}

uint8_t dsa_f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min<double>(std::fabs(double(x)), 448.0);               // satfinite
  if (a < 0.015625) return uint8_t(sign | uint8_t(std::nearbyint(a * 512.0)));  // subnormal (8 = min normal)
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  --e;                                 // a = (2m) 2^e, 2m in [1, 2)
  int q = int(std::nearbyint((2.0 * m - 1.0) * 8.0));
  if (q == 8) q = 0, ++e;
  if (e + 7 > 15 || (e + 7 == 15 && q == 7)) return uint8_t(sign | 0x7E);
  return uint8_t(sign | uint8_t((e + 7) << 3) | uint8_t(q));
}

Status dsa_key_store_check(const DsaKeyStoreParams& p) {
  K3_RETURN_IF_ERROR(check_cache(p.cache, "dsa_key_store"));
  if (p.n_tok < 0 || (p.n_tok > 0 && !p.k)) return error(Code::invalid_argument, "dsa_key_store: bad rows");
  return ok_status();
}

void dsa_key_store_ref(const DsaKeyStoreParams& p) {
  K3_ASSERT(dsa_key_store_check(p).ok());
  const DsaKeyCache& c = p.cache;
  const int Di = c.d_head;
  for (int t = 0; t < p.n_tok; ++t) {
    const int b = p.seq ? p.seq[t] : 0;
    const int64_t s = p.pos ? p.pos[t] : p.pos0 + t;
    const float* sc = nullptr;
    uint8_t* dst = const_cast<uint8_t*>(key_row(c, b, s, &sc));
    const float* k = p.k + size_t(t) * Di;
    if (c.fmt == DsaKeyFormat::bf16) {
      for (int e = 0; e < Di; ++e) {
        const uint16_t h = f32_to_bf16(k[e]);
        std::memcpy(dst + 2 * e, &h, 2);
      }
      continue;
    }
    float amax = 0.f;
    for (int e = 0; e < Di; ++e) amax = std::max(amax, std::fabs(k[e]));
    const float s_ = amax > 0.f ? amax / 448.f : 1.f;
    for (int e = 0; e < Di; ++e) dst[e] = dsa_f32_to_e4m3(k[e] / s_);
    *const_cast<float*>(sc) = s_;
  }
}

Status dsa_index_check(const DsaIndexParams& p) {
  K3_RETURN_IF_ERROR(check_cache(p.cache, "dsa_index"));
  if (p.n_head < 1 || p.n_head > 64)
    return error(Code::unsupported,
                 "dsa_index: " + std::to_string(p.n_head) + " index heads (supported 1..64)");
  if (p.n_q < 0) return error(Code::invalid_argument, "dsa_index: n_q < 0");
  if (p.stages != 0 && p.stages != 3 && p.stages != 6)
    return error(Code::invalid_argument, "dsa_index: stages " + std::to_string(p.stages) + " (0, 3 or 6)");
  const int64_t cap = int64_t(p.cache.max_pages) * p.cache.page_size;
  if (p.max_ctx < 1 || p.max_ctx > cap || p.max_ctx > p.ld || (!p.ctx_len && p.n_past + p.n_q > p.max_ctx))
    return error(Code::invalid_argument, "dsa_index: max_ctx " + std::to_string(p.max_ctx) +
                                             " must bound every query's context, fit the block table (" +
                                             std::to_string(cap) + ") and ld " + std::to_string(p.ld));
  if (p.max_ctx > (int64_t(1) << 30))
    return error(Code::unsupported,
                 "dsa_index: contexts longer than 2^30 (" + std::to_string(p.max_ctx) + ")");
  if (p.q_exact && p.cache.fmt != DsaKeyFormat::bf16)
    return error(Code::unsupported, "dsa_index: q_exact needs bf16 keys");
  if (p.n_q > 0 && (!p.q || !p.w || !p.score))
    return error(Code::invalid_argument, "dsa_index: null pointer");
  return ok_status();
}

void dsa_index_ref(const DsaIndexParams& p) {
  K3_ASSERT(dsa_index_check(p).ok());
  const int H = p.n_head, Di = p.cache.d_head;
  std::vector<double> q(size_t(H) * Di), k(static_cast<size_t>(Di));
  for (int i = 0; i < p.n_q; ++i) {
    const int b = p.ctx_len ? i : 0;
    const int64_t n = p.ctx_len ? p.ctx_len[i] : p.n_past + i + 1;
    K3_ASSERT(n >= 1 && n <= p.max_ctx);
    for (size_t j = 0; j < q.size(); ++j) {
      const float v = p.q[size_t(i) * q.size() + j];
      q[j] = p.q_exact || p.cache.fmt == DsaKeyFormat::fp8 ? double(v) : double(round_bf16(v));
    }
    const float* w = p.w + size_t(i) * H;
    for (int64_t s = 0; s < n; ++s) {
      const float* sc = nullptr;
      const uint8_t* r = key_row(p.cache, b, s, &sc);
      for (int e = 0; e < Di; ++e) {
        if (p.cache.fmt == DsaKeyFormat::bf16) {
          uint16_t h;
          std::memcpy(&h, r + 2 * e, 2);
          k[size_t(e)] = bf16_to_f32(h);
        } else {
          k[size_t(e)] = double(*sc) * f8_e4m3_to_f32(r[e]);
        }
      }
      double acc = 0;
      for (int h = 0; h < H; ++h) {
        double d = 0;
        for (int e = 0; e < Di; ++e) d += q[size_t(h) * Di + e] * k[size_t(e)];
        acc += double(w[h]) * std::max(d, 0.0);
      }
      p.score[size_t(i) * p.ld + size_t(s)] = float(acc * p.scale);
    }
  }
}

}  // namespace k3
