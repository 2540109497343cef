// safetensors.cpp: header parsing/validation and the mmap (contract in safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace k3 {

namespace {

using json = nlohmann::json;
constexpr uint64_t kMaxHeader = 100ull << 20;  // the safetensors reference limit

Status bad(const std::string& file, const std::string& msg) {
  return error(Code::bad_file, file + ": " + msg);
}

}  // namespace

Result<json> parse_json_strict(std::string_view text, const std::string& file) {
  std::vector<std::set<std::string>> keys;  // one key set per open object
  std::string dup;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start)
      keys.emplace_back();
    else if (ev == json::parse_event_t::object_end && !keys.empty())
      keys.pop_back();
    else if (ev == json::parse_event_t::key && !keys.empty() && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(file, "not valid JSON");
  if (!dup.empty()) return bad(file, "duplicate key \"" + dup + "\"");
  return j;
}

namespace {

Status parse_entry(const std::string& file, const std::string& name, const json& e, uint64_t data_size,
                   NamedTensor* out, uint64_t* begin, uint64_t* end) {
  auto fail = [&](const std::string& m) { return bad(file, "tensor \"" + name + "\": " + m); };
  if (!e.is_object()) return fail("entry is not an object");
  auto dt = e.find("dtype"), sh = e.find("shape"), of = e.find("data_offsets");
  if (dt == e.end() || sh == e.end() || of == e.end()) return fail("needs dtype, shape and data_offsets");
  if (!dt->is_string()) return fail("dtype is not a string");
  const std::string& dts = dt->get_ref<const std::string&>();
  DType dtype;
  if (!dtype_from_name(dts, &dtype)) return fail("unknown dtype \"" + dts + "\"");
  if (!sh->is_array()) return fail("shape is not an array");
  uint64_t numel = 1;
  bool overflow = false;
  std::vector<int64_t> shape;
  for (const json& d : *sh) {
    if (!d.is_number_unsigned()) return fail("shape entries must be non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    if (v > (uint64_t(1) << 48)) return fail("dimension " + std::to_string(v) + " is too large");
    if (v != 0 && numel > UINT64_MAX / v) overflow = true;
    numel *= v;
    shape.push_back(int64_t(v));
  }
  if (!of->is_array() || of->size() != 2 || !(*of)[0].is_number_unsigned() || !(*of)[1].is_number_unsigned())
    return fail("data_offsets must be two non-negative integers");
  const uint64_t b = (*of)[0].get<uint64_t>(), en = (*of)[1].get<uint64_t>();
  if (b > en) return fail("data_offsets begin " + std::to_string(b) + " > end " + std::to_string(en));
  if (en > data_size)
    return fail("data_offsets end " + std::to_string(en) + " is beyond the data region (" +
                std::to_string(data_size) + " bytes): file truncated?");
  const uint64_t esz = dtype_size(dtype);
  if (overflow || numel > UINT64_MAX / esz || numel * esz != en - b)
    return fail("shape " + shape_str(shape) + " " + dts + " needs " +
                (overflow ? std::string("too many") : std::to_string(numel * esz)) +
                " bytes but data_offsets span " + std::to_string(en - b));
  *begin = b;
  *end = en;
  out->name = name;
  out->view.dtype = dtype;
  out->view.shape = std::move(shape);
  out->view.nbytes = size_t(en - b);
  return ok_status();
}

}  // namespace

Result<std::vector<NamedTensor>> parse_safetensors(const void* bytes, size_t size, const std::string& file) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (size < 8) return bad(file, "too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  if (n > kMaxHeader) return bad(file, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > size - 8)
    return bad(file,
               "header length " + std::to_string(n) + " is beyond the file size " + std::to_string(size));
  const uint64_t data_offset = 8 + n, data_size = size - data_offset;
  K3_ASSIGN_OR_RETURN(
      json header,
      parse_json_strict(std::string_view(reinterpret_cast<const char*>(p + 8), n), file + " header"));
  if (!header.is_object()) return bad(file, "header is not a JSON object");

  std::vector<NamedTensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) per tensor
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return bad(file, "__metadata__ is not an object");
      continue;
    }
    NamedTensor t;
    uint64_t b = 0, e = 0;
    K3_RETURN_IF_ERROR(parse_entry(file, it.key(), *it, data_size, &t, &b, &e));
    if ((data_offset + b) % dtype_size(t.view.dtype) != 0)
      return bad(file, "tensor \"" + t.name + "\": data is not aligned to its " +
                           std::to_string(dtype_size(t.view.dtype)) + "-byte element size");
    t.view.data = p + data_offset + b;
    tensors.push_back(std::move(t));
    spans.emplace_back(b, e);
  }
  // No two non-empty tensors may share bytes.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a] < spans[b]; });
  uint64_t prev_end = 0;
  size_t prev = SIZE_MAX;
  for (size_t i : order) {
    if (spans[i].first == spans[i].second) continue;
    if (prev != SIZE_MAX && spans[i].first < prev_end)
      return bad(file, "tensors \"" + tensors[prev].name + "\" and \"" + tensors[i].name + "\" overlap");
    prev_end = spans[i].second;
    prev = i;
  }
  return tensors;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return error(errno == ENOENT ? Code::not_found : Code::bad_file, path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return error(Code::bad_file, path + ": not a regular file");
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ >= 8) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return error(Code::bad_file, path + ": mmap failed: " + std::strerror(err));
    }
    f->map_ = m;
  }
  ::close(fd);
  static const uint8_t kEmpty[1] = {0};
  K3_ASSIGN_OR_RETURN(f->tensors_, parse_safetensors(f->map_ ? f->map_ : kEmpty, f->size_, path));
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

}  // namespace k3
