// npy.cpp: .npy encode/parse (format in npy.h). The header dict is read by key, not by a general Python
// literal parser: 'descr', 'fortran_order' and 'shape' are all the format defines.
#include "engine/npy.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

namespace k3 {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

uint32_t read_le(const char* p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | uint8_t(p[i]);
  return v;
}

// The text after `'key':` (or "key":) with leading spaces skipped; npos-safe empty view when absent.
std::string_view value_of(std::string_view dict, std::string_view key) {
  for (char q : {'\'', '"'}) {
    const std::string quoted = std::string(1, q) + std::string(key) + std::string(1, q);
    size_t at = dict.find(quoted);
    if (at == std::string_view::npos) continue;
    at = dict.find(':', at + quoted.size());
    if (at == std::string_view::npos) return {};
    at = dict.find_first_not_of(" \t", at + 1);
    return at == std::string_view::npos ? std::string_view{} : dict.substr(at);
  }
  return {};
}

Status parse_header(std::string_view dict, const std::string& name, std::string* descr, bool* fortran,
                    std::vector<int64_t>* shape) {
  auto bad = [&](const std::string& m) { return error(Code::bad_file, name + ": .npy header " + m); };
  std::string_view d = value_of(dict, "descr");
  if (d.empty() || (d[0] != '\'' && d[0] != '"')) return bad("has no 'descr' string");
  const size_t end = d.find(d[0], 1);
  if (end == std::string_view::npos) return bad("has an unterminated 'descr'");
  *descr = std::string(d.substr(1, end - 1));

  std::string_view f = value_of(dict, "fortran_order");
  if (f.starts_with("False"))
    *fortran = false;
  else if (f.starts_with("True"))
    *fortran = true;
  else
    return bad("has no 'fortran_order' True/False");

  std::string_view s = value_of(dict, "shape");
  if (s.empty() || s[0] != '(') return bad("has no 'shape' tuple");
  const size_t close = s.find(')');
  if (close == std::string_view::npos) return bad("has an unterminated 'shape'");
  shape->clear();
  int64_t numel = 1;
  for (size_t i = 1; i < close;) {
    while (i < close && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= close) break;
    if (s[i] < '0' || s[i] > '9') return bad("'shape' holds a non-integer");
    int64_t v = 0;
    for (; i < close && s[i] >= '0' && s[i] <= '9'; ++i) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return bad("'shape' dimension overflows");
      v = v * 10 + (s[i] - '0');
    }
    if (v > 0 && numel > std::numeric_limits<int64_t>::max() / 16 / v) return bad("'shape' is too large");
    numel *= v;
    shape->push_back(v);
    if (i < close && s[i] != ',' && s[i] != ' ') return bad("'shape' is malformed");
  }
  return ok_status();
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string encode_npy(const void* data, NpyType type, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  std::string dims;  // "()", "(5,)", "(2, 3)": a 1-tuple keeps its comma
  for (size_t i = 0; i < shape.size(); ++i) {
    K3_ASSERT(shape[i] >= 0);
    numel *= shape[i];
    dims += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  std::string dict = std::string("{'descr': '") + (type == NpyType::f32 ? "<f4" : "<i4") +
                     "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = kMagicLen + 2 + 2 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');

  std::string out(kMagic, kMagicLen);
  out.push_back(char(1));
  out.push_back(char(0));
  out.push_back(char(dict.size() & 0xff));
  out.push_back(char(dict.size() >> 8));
  out += dict;
  const size_t n_bytes = size_t(numel) * 4;  // both types are 4 bytes; the host is little endian
  if (n_bytes > 0) out.append(static_cast<const char*>(data), n_bytes);
  return out;
}

static Status write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return error(Code::bad_file, path + ": cannot open for writing");
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) return error(Code::bad_file, path + ": write failed");
  return ok_status();
}

Status write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  return write_bytes(path, encode_npy(data, NpyType::f32, shape));
}

Status write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  return write_bytes(path, encode_npy(data, NpyType::i32, shape));
}

Result<NpyArray> parse_npy(std::string_view bytes, const std::string& name) {
  auto bad = [&](const std::string& m) { return error(Code::bad_file, name + ": " + m); };
  if (bytes.size() < kMagicLen + 4 || bytes.substr(0, kMagicLen) != std::string_view(kMagic, kMagicLen))
    return bad("not an .npy file (no \\x93NUMPY magic)");
  const int major = uint8_t(bytes[kMagicLen]);
  if (major < 1 || major > 3) return bad(".npy version " + std::to_string(major) + " is not supported");
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t header_at = kMagicLen + 2 + size_t(len_bytes);
  if (bytes.size() < header_at) return bad("truncated .npy header");
  const size_t header_len = read_le(bytes.data() + kMagicLen + 2, len_bytes);
  if (bytes.size() - header_at < header_len) return bad("truncated .npy header");

  std::string descr;
  bool fortran = false;
  NpyArray a;
  K3_RETURN_IF_ERROR(parse_header(bytes.substr(header_at, header_len), name, &descr, &fortran, &a.shape));
  if (fortran) return bad("Fortran-order arrays are not supported (save with C order)");
  int item = 0;
  if (descr == "<f4" || descr == "<i4" || descr == "<u4")
    item = 4;
  else if (descr == "<f8" || descr == "<i8")
    item = 8;
  else
    return bad("dtype '" + descr + "' is not supported (float32/float64/int32/uint32/int64, little endian)");

  const std::string_view data = bytes.substr(header_at + header_len);
  const int64_t n = a.numel();
  if (uint64_t(data.size()) != uint64_t(n) * uint64_t(item))
    return bad("data holds " + std::to_string(data.size()) + " bytes, shape needs " +
               std::to_string(n * item));
  const char* p = data.data();
  if (descr[1] == 'f') {
    a.type = NpyType::f32;
    a.f32.resize(size_t(n));
    if (item == 4 && n > 0) std::memcpy(a.f32.data(), p, size_t(n) * 4);
    for (int64_t i = 0; item == 8 && i < n; ++i) {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      a.f32[size_t(i)] = float(v);
    }
  } else {
    a.type = NpyType::i32;
    a.i32.resize(size_t(n));
    if (descr == "<i4" && n > 0) std::memcpy(a.i32.data(), p, size_t(n) * 4);
    for (int64_t i = 0; descr == "<u4" && i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + i * 4, 4);
      if (v > uint32_t(std::numeric_limits<int32_t>::max()))
        return bad("uint32 value " + std::to_string(v) + " at index " + std::to_string(i) +
                   " does not fit in int32");
      a.i32[size_t(i)] = int32_t(v);
    }
    for (int64_t i = 0; item == 8 && i < n; ++i) {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        return bad("int64 value " + std::to_string(v) + " at index " + std::to_string(i) +
                   " does not fit in int32");
      a.i32[size_t(i)] = int32_t(v);
    }
  }
  return a;
}

Result<NpyArray> read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error(Code::not_found, path + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(bytes, path);
}

}  // namespace k3
