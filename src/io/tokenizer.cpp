// tokenizer.cpp: the Kimi tiktoken tokenizer (FORMATS.md §1).
//
// encode(text, allow_special):
//   text  = Python bytes.decode("utf-8", "replace") of the input (utf8.h)
//   for slice in guard_slices(text):                  (400,000-char windows, 25,000-char same-class runs)
//     allow_special: cut the slice at special spellings (leftmost; longest at one position) -> their ids
//     every other span: pat_str pieces (pretokenizer.h) -> BPE per piece (bpe.h)
// decode(ids) = concatenated token bytes; specials render as their names; ids outside [0, n_vocab) render
// as nothing. Files: DIR/tiktoken.model ("base64 SP rank" lines, dense ranks, all 256 bytes) and
// DIR/tokenizer_config.json (added_tokens_decoder names the 256 reserved ids n_base..n_base+255; a reserved id
// without a name is <|reserved_token_{id}|>).
#include "io/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "io/bpe.h"
#include "io/pretokenizer.h"
#include "io/utf8.h"

namespace k3 {
namespace {

constexpr int32_t kNumReserved = 256;

// Strict RFC 4648 base64 with padding; nullopt on any bad character or length.
std::optional<std::string> base64_decode(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=') : 0;
    int v[4];
    for (int k = 0; k < 4 - pad; ++k)
      if ((v[k] = value(s[i + k])) < 0) return std::nullopt;
    const uint32_t w = (v[0] << 18) | (v[1] << 12) | ((pad < 2 ? v[2] : 0) << 6) | (pad < 1 ? v[3] : 0);
    out += static_cast<char>(w >> 16);
    if (pad < 2) out += static_cast<char>((w >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(w & 0xFF);
  }
  return out;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return error(Code::not_found, path + ": cannot open (missing tokenizer file?)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class KimiTokenizer final : public Tokenizer {
 public:
  Status load(const std::string& dir) {
    const std::string model_path = (std::filesystem::path(dir) / "tiktoken.model").string();
    const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
    K3_RETURN_IF_ERROR(load_ranks(model_path));
    K3_RETURN_IF_ERROR(load_specials(config_path));
    K3_ASSIGN_OR_RETURN(pretok_, Pretokenizer::create());
    return ok_status();
  }

  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override {
    std::string clean;
    if (!utf8::is_valid(text)) {
      clean = utf8::sanitize(text);
      text = clean;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 1);
    for (std::string_view slice : guard_slices(text)) {
      if (!allow_special) {
        encode_ordinary(slice, ids);
        continue;
      }
      size_t pos = 0;
      while (pos < slice.size()) {
        auto [at, id, len] = find_special(slice, pos);
        encode_ordinary(slice.substr(pos, at - pos), ids);
        if (len == 0) break;
        ids.push_back(id);
        pos = at + len;
      }
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += token_bytes(id);
    return out;
  }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= n_vocab()) return {};
    return id < n_base() ? tokens_[id] : special_names_[id - n_base()];
  }
  int32_t n_vocab() const override { return n_base() + kNumReserved; }
  int32_t n_base() const override { return static_cast<int32_t>(tokens_.size()); }
  bool is_special(int32_t id) const override { return id >= n_base() && id < n_vocab(); }
  std::optional<int32_t> special_id(std::string_view name) const override {
    auto it = special_ids_.find(std::string(name));
    if (it == special_ids_.end()) return std::nullopt;
    return it->second;
  }

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    pretok_.split(text, [&](std::string_view piece) { ranks_.encode_piece(piece, ids); });
  }

  struct SpecialHit {
    size_t at;
    int32_t id;
    size_t len;  // 0: none found, `at` = end of text
  };
  // Leftmost special spelling at or after `pos`; the longest name wins at one position.
  SpecialHit find_special(std::string_view s, size_t pos) const {
    for (size_t i = pos; i < s.size(); ++i) {
      const auto& cands = by_first_byte_[static_cast<uint8_t>(s[i])];
      size_t best_len = 0;
      int32_t best_id = -1;
      for (int32_t id : cands) {
        const std::string& name = special_names_[id - n_base()];
        if (name.size() > best_len && s.compare(i, name.size(), name) == 0) best_len = name.size(), best_id = id;
      }
      if (best_len) return {i, best_id, best_len};
    }
    return {s.size(), -1, 0};
  }

  Status load_ranks(const std::string& path) {
    K3_ASSIGN_OR_RETURN(std::string text, read_file(path));
    BpeRanks::Map map;
    std::vector<std::optional<std::string>> by_rank;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
      const size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        return error(Code::bad_file, where() + "expected 'base64 rank'");
      auto bytes = base64_decode(line.substr(0, sp));
      if (!bytes) return error(Code::bad_file, where() + "bad base64 token");
      std::string_view num = line.substr(sp + 1);
      if (num.empty() || num.size() > 9 || !std::all_of(num.begin(), num.end(), [](char c) {
            return c >= '0' && c <= '9';
          }))
        return error(Code::bad_file, where() + "bad rank '" + std::string(num) + "'");
      const size_t rank = std::stoul(std::string(num));
      if (rank >= by_rank.size()) by_rank.resize(rank + 1);
      if (by_rank[rank]) return error(Code::bad_file, where() + "duplicate rank " + std::to_string(rank));
      if (!map.emplace(*bytes, static_cast<int32_t>(rank)).second)
        return error(Code::bad_file, where() + "duplicate token bytes");
      by_rank[rank] = std::move(*bytes);
    }
    for (size_t r = 0; r < by_rank.size(); ++r)
      if (!by_rank[r]) return error(Code::bad_file, path + ": ranks are not dense (rank " + std::to_string(r) +
                                                        " missing of 0.." + std::to_string(by_rank.size() - 1) + ")");
    for (int b = 0; b < 256; ++b)
      if (!map.count(std::string(1, static_cast<char>(b))))
      {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        return error(Code::bad_file, path + ": single byte " + hex + " has no rank");
      }
    tokens_.clear();
    for (auto& t : by_rank) tokens_.push_back(std::move(*t));
    ranks_ = BpeRanks(std::move(map));
    return ok_status();
  }

  Status load_specials(const std::string& path) {
    K3_ASSIGN_OR_RETURN(std::string text, read_file(path));
    nlohmann::json cfg = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object()) return error(Code::bad_file, path + ": not a JSON object");
    const int32_t base = n_base();
    special_names_.clear();
    for (int32_t k = 0; k < kNumReserved; ++k)
      special_names_.push_back("<|reserved_token_" + std::to_string(base + k) + "|>");
    if (cfg.contains("added_tokens_decoder")) {
      const auto& dec = cfg["added_tokens_decoder"];
      if (!dec.is_object()) return error(Code::bad_file, path + ": added_tokens_decoder is not an object");
      for (const auto& [key, entry] : dec.items()) {
        char* end = nullptr;
        const long id = std::strtol(key.c_str(), &end, 10);
        if (key.empty() || *end != '\0' || id < base || id >= base + kNumReserved)
          return error(Code::bad_file, path + ": added_tokens_decoder id '" + key + "' is outside the reserved range " +
                                           std::to_string(base) + ".." + std::to_string(base + kNumReserved - 1));
        if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
            entry["content"].get<std::string>().empty())
          return error(Code::bad_file, path + ": added_tokens_decoder[" + key + "] has no content string");
        special_names_[id - base] = entry["content"].get<std::string>();
      }
    }
    special_ids_.clear();
    for (auto& v : by_first_byte_) v.clear();
    for (int32_t k = 0; k < kNumReserved; ++k) {
      if (special_ids_.emplace(special_names_[k], base + k).second)
        by_first_byte_[static_cast<uint8_t>(special_names_[k][0])].push_back(base + k);
    }
    return ok_status();
  }

  std::vector<std::string> tokens_;          // [n_base] token bytes by rank
  BpeRanks ranks_;                           // bytes -> rank
  std::vector<std::string> special_names_;   // [256] names of n_base + k
  std::unordered_map<std::string, int32_t> special_ids_;
  std::vector<int32_t> by_first_byte_[256];  // special ids whose name starts with that byte
  Pretokenizer pretok_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::open(const std::string& dir) {
  auto tok = std::make_unique<KimiTokenizer>();
  K3_RETURN_IF_ERROR(tok->load(dir).with_context("loading tokenizer from " + dir));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

// ---- StreamDecoder: emit only complete characters; ill-formed bytes become U+FFFD as Python would ----

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const utf8::Seq q = utf8::scan(pending_, i);
    if (q.truncated) break;  // may complete with the next token: hold it back
    if (q.valid)
      out.append(pending_, i, q.len);
    else
      out.append(utf8::kReplacement);
    i += q.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace k3
