// cases_common.h: shapes shared by the row-wise op cases (norms, activations).
//
// Odd row counts (1, 17, 33, 127, 989), widths that are and are not multiples of 16, and row strides
// larger than the width (pad > 0) so non-contiguous inputs and outputs are covered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace k3::opt {

struct RowShape {
  int64_t n_row, d, pad;  // input and output row stride = d + pad
  std::string str() const {
    return "n_row=" + std::to_string(n_row) + " d=" + std::to_string(d) + (pad ? " ld=" + std::to_string(d + pad) : "");
  }
};

inline std::vector<RowShape> row_shapes() {
  return {{1, 7, 0}, {17, 64, 3}, {33, 100, 0}, {127, 129, 5}, {989, 48, 0}, {3, 2304, 16}, {2, 7168, 0}};
}

inline RowShape row_perf_shape() { return {64, 7168, 0}; }

}  // namespace k3::opt
