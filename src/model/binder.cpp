// binder.cpp: Binder (binder.h).
#include "model/binder.h"

#include <cstring>

namespace k3 {

void read_f32(const TensorView& t, int64_t offset, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(out, t.as<float>() + offset, size_t(n) * 4);
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(t.as<uint16_t>()[offset + i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(t.as<uint16_t>()[offset + i]);
      break;
    default:
      K3_ASSERT(!"read_f32: unsupported dtype");
  }
}

bool Binder::has(const std::string& name) const {
  return ckpt_.find(prefix_ + name + ".weight") || ckpt_.find(prefix_ + name + ".weight_packed") ||
         ckpt_.find(prefix_ + name);
}

const TensorView* Binder::tensor(const std::string& name) {
  const TensorView* t = ckpt_.find(prefix_ + name);
  if (!t) fail(error(Code::not_found, "missing tensor " + prefix_ + name));
  return t;
}

LinearWeight Binder::linear(const std::string& name, int64_t out, int64_t in) {
  LinearWeight W;
  const std::string full = prefix_ + name;
  if (const TensorView* packed = ckpt_.find(full + ".weight_packed")) {
    const TensorView* scale = ckpt_.find(full + ".weight_scale");
    if (!scale) {
      fail(error(Code::not_found, "missing tensor " + full + ".weight_scale"));
      return W;
    }
    const int64_t o = packed->ndim() == 2 ? packed->dim(0) : -1,
                  i2 = packed->ndim() == 2 ? packed->dim(1) : -1;
    if (packed->dtype != DType::u8 || scale->dtype != DType::u8 || o < 0 || scale->ndim() != 2 ||
        scale->dim(0) != o || scale->dim(1) * 16 != i2 || (out >= 0 && o != out) ||
        (in >= 0 && 2 * i2 != in)) {
      fail(error(Code::bad_file, "bad MXFP4 tensor " + full + ": packed " + describe(*packed) + ", scale " +
                                     describe(*scale)));
      return W;
    }
    const uint8_t* s = scale->as<uint8_t>();
    for (int64_t j = 0; j < scale->numel(); ++j)
      if (s[j] == 255) {
        fail(error(Code::bad_file, full + ".weight_scale holds E8M0 255 (NaN)"));
        return W;
      }
    W.dtype = DType::u8;
    W.out = o;
    W.in = 2 * i2;
    W.w = packed->data;
    W.scale = s;
    return W;
  }
  const TensorView* t = ckpt_.find(full + ".weight");
  if (!t) {
    fail(error(Code::not_found, "missing tensor " + full + ".weight"));
    return W;
  }
  const bool dtype_ok = t->dtype == DType::bf16 || t->dtype == DType::f16 || t->dtype == DType::f32 ||
                        t->dtype == DType::f8_e4m3;
  if (t->ndim() != 2 || !dtype_ok || (out >= 0 && t->dim(0) != out) || (in >= 0 && t->dim(1) != in)) {
    fail(error(Code::bad_file, "bad tensor " + full + ".weight: " + describe(*t) + ", expected [" +
                                   std::to_string(out) + ", " + std::to_string(in) + "]"));
    return W;
  }
  W.dtype = t->dtype;
  W.out = t->dim(0);
  W.in = t->dim(1);
  W.w = t->data;
  return W;
}

std::vector<float> Binder::vec(const std::string& name, int64_t numel) {
  const TensorView* t = tensor(name);
  if (!t) return {};
  const bool dtype_ok = t->dtype == DType::bf16 || t->dtype == DType::f16 || t->dtype == DType::f32;
  if (!dtype_ok || (numel >= 0 && t->numel() != numel)) {
    fail(error(Code::bad_file, "bad tensor " + prefix_ + name + ": " + describe(*t) + ", expected " +
                                   std::to_string(numel) + " elements"));
    return {};
  }
  std::vector<float> v(size_t(t->numel()));
  read_f32(*t, 0, t->numel(), v.data());
  return v;
}

}  // namespace k3
