// safetensors.h: one .safetensors file, mmapped read-only (MAP_PRIVATE), tensors as zero-copy views.
//
//   file = u64 LE n | n bytes of JSON header | data region
//   header = { "__metadata__": {...}?, NAME: {"dtype": "BF16", "shape": [d0, ..], "data_offsets": [b, e]} }
//   tensor bytes = data[b, e), offsets relative to the data region (8 + n)
//
// Validation (every failure is a Status naming the file and, where there is one, the tensor):
//   8 + n <= file size, n <= 100 MB; header is a JSON object; no duplicate key at any depth;
//   dtype known (core/dtype.h names); shape = non-negative integers; numel * dtype_size == e - b
//   (no overflow); b <= e <= data size; no two tensors overlap; b aligned to the element size
//   (views are read as typed arrays); `__metadata__` must be an object and is otherwise ignored.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace k3 {

struct NamedTensor {
  std::string name;
  TensorView view;
};

// Parses and validates a whole safetensors image held in memory (`bytes`, `size` = the file length);
// the views point into `bytes`. `file` is only used in error messages. Used by SafetensorsFile and
// by the fuzzer.
Result<std::vector<NamedTensor>> parse_safetensors(const void* bytes, size_t size, const std::string& file);

// JSON parse that rejects a duplicate key in any object (nlohmann keeps the last one silently);
// errors are Code::bad_file "FILE: ...". Also used for config.json and the shard index.
Result<nlohmann::json> parse_json_strict(std::string_view text, const std::string& file);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  // In file order of the header; views stay valid while this object lives.
  const std::vector<NamedTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<NamedTensor> tensors_;
};

}  // namespace k3
