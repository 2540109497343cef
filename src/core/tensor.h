// tensor.h: a non-owning, row-major view of checkpoint or scratch memory.
// Shapes are outermost-first, as safetensors stores them ([out, in] for a linear weight).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace k3 {

struct TensorView {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // outermost first
  const void* data = nullptr;  // points into the mmapped file (zero-copy) or owned scratch
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? int(shape.size()) + i : i)); }
  int ndim() const { return int(shape.size()); }
  template <class T>
  const T* as() const { return static_cast<const T*>(data); }
};

// "[3072, 1792] U8"
std::string describe(const TensorView& t);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace k3
