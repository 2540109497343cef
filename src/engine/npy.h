// npy.h: the NumPy .npy format (version 1.0 written; 1.0, 2.0 and 3.0 read), just enough for logits and
// token ids.
//
//   file   := "\x93NUMPY" major minor header_len (u16 LE for v1, u32 LE for v2/v3) header data
//   header := a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (T, V), } padded
//             with spaces and one '\n' so that the data starts at a multiple of 64 bytes
//   data   := numel elements, C order, little endian
//
// Written: float32 ('<f4') and int32 ('<i4'). Read: '<f4' and '<f8' (-> float32), '<i4', '<u4' and '<i8'
// (-> int32, range-checked: NumPy's default integer is int64), '|u1'/'|i1' not supported. Fortran order,
// big-endian data, a truncated file or a shape that does not match the data size -> Status naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace k3 {

enum class NpyType { f32, i32 };

struct NpyArray {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;  // outermost first; {} = scalar
  std::vector<float> f32;      // [numel] when type == f32
  std::vector<int32_t> i32;    // [numel] when type == i32
  int64_t numel() const;
};

Status write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Status write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);
// The bytes of an .npy file (what write_npy writes).
std::string encode_npy(const void* data, NpyType type, const std::vector<int64_t>& shape);

Result<NpyArray> read_npy(const std::string& path);
// Parses the bytes of an .npy file; `name` only labels error messages.
Result<NpyArray> parse_npy(std::string_view bytes, const std::string& name = "<memory>");

}  // namespace k3
