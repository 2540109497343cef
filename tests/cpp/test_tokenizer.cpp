// test_tokenizer.cpp: the Kimi tokenizer on the tiny K2/K3 and test tokenizers (tests/data/tokenizer-*):
// loading and its errors, specials on/off, BPE (linear = heap), pat_str pieces, the long-input guard,
// Python-compatible invalid UTF-8, StreamDecoder on characters split across tokens.
// Parity with tiktoken itself is tests/python/test_tokenizer_parity.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "io/bpe.h"
#include "io/pretokenizer.h"
#include "io/tokenizer.h"
#include "io/utf8.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;

std::string data_dir(const char* name) { return std::string(K3_SOURCE_DIR) + "/tests/data/" + name; }

std::unique_ptr<Tokenizer> open_ok(const char* name) {
  auto r = Tokenizer::open(data_dir(name));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r.value()) : nullptr;
}

// A scratch tokenizer directory: the tiny K3 files, with tiktoken.model / config replaced on request.
struct ScratchDir {
  fs::path dir;
  ScratchDir() {
    dir = fs::temp_directory_path() / ("k3_tok_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir);
    fs::copy(data_dir("tokenizer-tiny-k3"), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  ~ScratchDir() { fs::remove_all(dir); }
  std::string read(const char* f) const {
    std::ifstream in(dir / f, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  void write(const char* f, const std::string& s) const { std::ofstream(dir / f, std::ios::binary) << s; }
  std::string open_error() const {
    auto r = Tokenizer::open(dir.string());
    return r.ok() ? "" : r.status().message();
  }
};

TEST(Tokenizer, OpensTinyTokenizersWithTheirSpecials) {
  auto k3 = open_ok("tokenizer-tiny-k3");
  auto k2 = open_ok("tokenizer-tiny-k2");
  ASSERT_TRUE(k3 && k2);
  EXPECT_EQ(k3->n_base(), 1024);
  EXPECT_EQ(k3->n_vocab(), 1280);
  // Same offsets from n_base as the real ids from 163584 (FORMATS.md §1.3).
  EXPECT_EQ(k3->special_id("<|end_of_msg|>"), 1024 + 2);
  EXPECT_EQ(k3->special_id("<|open|>"), 1024 + 3);
  EXPECT_EQ(k3->special_id("<|sep|>"), 1024 + 5);
  EXPECT_EQ(k2->special_id("<|im_end|>"), 1024 + 2);
  EXPECT_EQ(k2->special_id("<|im_middle|>"), 1024 + 17);
  EXPECT_EQ(k2->special_id("[PAD]"), 1024 + 255);
  EXPECT_FALSE(k3->special_id("<|im_end|>").has_value());
  EXPECT_TRUE(k3->is_special(1027));
  EXPECT_FALSE(k3->is_special(1023));
  EXPECT_EQ(k3->decode({1027}), "<|open|>");
  EXPECT_EQ(k3->token_bytes(65), "A");
  EXPECT_EQ(k3->token_bytes(-1), "");
  EXPECT_EQ(k3->token_bytes(1280), "");
}

TEST(Tokenizer, AllowSpecialOnAndOff) {
  auto tok = open_ok("tokenizer-tiny-k3");
  ASSERT_TRUE(tok);
  const std::string text = "hi<|open|>user<|sep|>x<|reserved_token_1032|>";
  auto on = tok->encode(text, true);
  auto off = tok->encode(text, false);
  EXPECT_EQ(std::count(on.begin(), on.end(), 1027), 1);
  EXPECT_EQ(std::count(on.begin(), on.end(), 1029), 1);
  EXPECT_EQ(std::count(on.begin(), on.end(), 1032), 1);  // unnamed reserved id, by its default name
  for (int32_t id : off) EXPECT_FALSE(tok->is_special(id));
  EXPECT_EQ(tok->decode(on), text);
  EXPECT_EQ(tok->decode(off), text);
  EXPECT_GT(off.size(), on.size());
}

TEST(Tokenizer, UnnamedReservedIdsGetDefaultNames) {
  ScratchDir s;
  s.write("tokenizer_config.json", R"({"added_tokens_decoder": {"1027": {"content": "<|open|>"}}})");
  auto r = Tokenizer::open(s.dir.string());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->special_id("<|open|>"), 1027);
  EXPECT_EQ((*r)->special_id("<|reserved_token_1024|>"), 1024);
  EXPECT_EQ((*r)->decode({1279}), "<|reserved_token_1279|>");
}

TEST(Tokenizer, RoundTripsMixedText) {
  auto tok = open_ok("tokenizer-test");
  ASSERT_TRUE(tok);
  for (std::string text : {"", "Hello, world!", "中文和日本語のテキスト", "👨‍👩‍👧‍👦 👍🏽", "  \r\n\t x  ",
                           "It'S we'LL 12345678", "cafe\xCC\x81"}) {
    auto ids = tok->encode(text);
    EXPECT_EQ(tok->decode(ids), text);
    if (text.empty()) EXPECT_TRUE(ids.empty());
  }
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikePython) {
  // Python: bytes.decode("utf-8", errors="replace"), one U+FFFD per maximal ill-formed subpart.
  const std::string R(utf8::kReplacement);
  EXPECT_EQ(utf8::sanitize("abc\x80" "d"), "abc" + R + "d");
  EXPECT_EQ(utf8::sanitize("\xE4\xB8"), R);                      // truncated 中
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), R + R + R);          // surrogate
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), R + R);                  // overlong
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), R + R + R + R);  // > U+10FFFF
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98x"), R + "x");           // truncated emoji
  EXPECT_EQ(utf8::sanitize("\xE2\x82\x28"), R + "(");
  EXPECT_TRUE(utf8::is_valid("中文👍"));
  EXPECT_FALSE(utf8::is_valid("\xE4\xB8"));
  auto tok = open_ok("tokenizer-tiny-k3");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("a\xFF" "b"), tok->encode("a" + R + "b"));
}

TEST(Tokenizer, BpeLinearAndHeapAgree) {
  auto tok = open_ok("tokenizer-test");
  ASSERT_TRUE(tok);
  BpeRanks::Map map;
  for (int32_t i = 0; i < tok->n_base(); ++i) map.emplace(tok->token_bytes(i), i);
  BpeRanks ranks(std::move(map));
  std::mt19937 rng(1);
  const std::vector<std::string> alphabet = {"e", "t", "th", "he", " ", "a", "in", "er", "中", "文", "\xF0", "1",
                                             "'s", "ing", "ation", "x"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string piece;
    const int n = 1 + rng() % 60;
    for (int k = 0; k < n; ++k) piece += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> a, b;
    ranks.merge_linear(piece, a);
    ranks.merge_heap(piece, b);
    ASSERT_EQ(a, b) << piece;
    std::string back;
    for (int32_t id : a) back += tok->token_bytes(id);
    EXPECT_EQ(back, piece);
  }
}

TEST(Tokenizer, PatStrPieces) {
  auto p = Pretokenizer::create();
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto pieces = [&](std::string_view s) {
    std::vector<std::string> out;
    p->split(s, [&](std::string_view x) { out.emplace_back(x); });
    return out;
  };
  using V = std::vector<std::string>;
  // Expected values from Python `regex` (V1) on the Kimi pat_str.
  EXPECT_EQ(pieces("Hello world'S  \n\n x"), (V{"Hello", " world'S", "  \n\n", " x"}));
  EXPECT_EQ(pieces("HTTPServer中文12345!!\r\n\tfoo"), (V{"HTTPServer", "中文", "123", "45", "!!\r\n", "\tfoo"}));
  EXPECT_EQ(pieces("don't  ab"), (V{"don't", " ", " ab"}));
  EXPECT_FALSE(Pretokenizer::unicode_version().empty());
}

TEST(Tokenizer, LongInputGuardSlices) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(guard_slices("aaaa  bbbbbb", 100, 3), (V{"aaa", "a  bbb", "bbb"}));
  EXPECT_EQ(guard_slices("abcdefgh", 5, 100), (V{"abcde", "fgh"}));
  EXPECT_EQ(guard_slices("中文字符串", 2, 100), (V{"中文", "字符", "串"}));  // code points, not bytes
  EXPECT_EQ(guard_slices("\x1c\x1c\x1c\x1c", 100, 3), (V{"\x1c\x1c\x1c", "\x1c"}));  // Python isspace()
  EXPECT_EQ(guard_slices("", 100, 3), (V{""}));
  auto tok = open_ok("tokenizer-tiny-k3");
  ASSERT_TRUE(tok);
  const std::string run(30'000, 'a');
  EXPECT_EQ(tok->decode(tok->encode(run)), run);
}

TEST(Tokenizer, BadFilesGiveClearErrors) {
  EXPECT_NE(Tokenizer::open("/nonexistent/dir").status().message().find("tiktoken.model"), std::string::npos);
  {
    ScratchDir s;
    fs::remove(s.dir / "tokenizer_config.json");
    EXPECT_NE(s.open_error().find("tokenizer_config.json"), std::string::npos);
  }
  {
    ScratchDir s;
    std::string m = s.read("tiktoken.model");
    m.replace(m.find('\n') + 1, 4, "A*A=");  // line 2
    s.write("tiktoken.model", m);
    const std::string e = s.open_error();
    EXPECT_NE(e.find("tiktoken.model:2: bad base64"), std::string::npos) << e;
  }
  {
    ScratchDir s;
    s.write("tiktoken.model", s.read("tiktoken.model") + "YWJjZGVmZ2g= 5000\n");  // "abcdefgh" at rank 5000
    const std::string e = s.open_error();
    EXPECT_NE(e.find("not dense"), std::string::npos) << e;
  }
  {
    ScratchDir s;
    std::string m = s.read("tiktoken.model");
    m.erase(0, m.find('\n') + 1);  // drop byte 0x00 (rank 0)
    m += "YWJjZGVmZ2g= 0\n";       // keep ranks dense
    s.write("tiktoken.model", m);
    const std::string e = s.open_error();
    EXPECT_NE(e.find("0x00 has no rank"), std::string::npos) << e;
  }
  {
    ScratchDir s;
    s.write("tiktoken.model", s.read("tiktoken.model") + "QQ== 1024\n");  // "A" again
    EXPECT_NE(s.open_error().find("duplicate token bytes"), std::string::npos);
  }
  {
    ScratchDir s;
    s.write("tokenizer_config.json", "{not json");
    EXPECT_NE(s.open_error().find("not a JSON object"), std::string::npos);
  }
  {
    ScratchDir s;
    s.write("tokenizer_config.json", R"({"added_tokens_decoder": {"5": {"content": "<x>"}}})");
    EXPECT_NE(s.open_error().find("outside the reserved range"), std::string::npos);
  }
}

TEST(Tokenizer, StreamDecoderHoldsSplitCharacters) {
  auto tok = open_ok("tokenizer-tiny-k3");  // 1024 ranks: CJK and emoji are split into byte tokens
  ASSERT_TRUE(tok);
  const std::string text = "a中文👍🏽b é";
  auto ids = tok->encode(text);
  ASSERT_GT(ids.size(), 8u);
  StreamDecoder dec(*tok);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = dec.push(id);
    EXPECT_TRUE(utf8::is_valid(piece)) << "half a character emitted";
    all += piece;
  }
  all += dec.flush();
  EXPECT_EQ(all, text);

  StreamDecoder bad(*tok);
  EXPECT_EQ(bad.push(0xE4), "");  // single-byte token ids: ranks 0..255 are the bytes
  EXPECT_EQ(bad.push(0xB8), "");
  EXPECT_EQ(bad.push('x'), std::string(utf8::kReplacement) + "x");  // the tail can no longer complete
  EXPECT_EQ(bad.push(0xF0), "");
  EXPECT_EQ(bad.flush(), utf8::kReplacement);
  EXPECT_EQ(bad.flush(), "");
}

}  // namespace
}  // namespace k3
