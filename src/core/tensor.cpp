#include "core/tensor.h"

namespace k3 {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe(const TensorView& t) { return shape_str(t.shape) + " " + std::string(dtype_name(t.dtype)); }

}  // namespace k3
