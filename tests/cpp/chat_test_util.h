// chat_test_util.h: a test-only stand-in for k3::Tokenizer, used by test_chat*.cpp until the real
// tiktoken tokenizer (io/tokenizer.cpp) can open tests/data/tokenizer-tiny-{k2,k3}.
//
// Base vocabulary (n_base = 1024): ids 0..255 = single bytes, 256.. = a few whole words, matched
// greedily (longest first), so some tags are one token ("message") and some span several ("think" is
// 5 byte tokens) and multi-byte UTF-8 characters are split across tokens. Specials: the names of the
// tiny tokenizer's tokenizer_config.json at 1024 + the real offsets.
#pragma once

#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/chat.h"

namespace k3::test {

// A message with just a role and text content.
inline Message msg(std::string role, std::string content) {
  Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}


class FakeTokenizer final : public Tokenizer {
 public:
  explicit FakeTokenizer(const std::string& family) {
    std::ifstream f(std::string(K3_SOURCE_DIR) + "/tests/data/tokenizer-tiny-" + family + "/tokenizer_config.json");
    nlohmann::json cfg = nlohmann::json::parse(f);
    for (auto& [id, tok] : cfg["added_tokens_decoder"].items()) specials_[tok["content"]] = std::stoi(id);
    for (int i = 0; i < 256; ++i) vocab_.push_back(std::string(1, static_cast<char>(i)));
    for (const char* w : {"message", "response", " role", "assistant", "user", "system", "tool", "call",
                          "argument", "=\"", "functions", "Return", "hello", " the", "\":\""}) {
      vocab_.push_back(w);
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      if (allow_special) {
        bool hit = false;
        for (const auto& [name, id] : specials_) {
          if (text.substr(i, name.size()) == name) {
            ids.push_back(id);
            i += name.size();
            hit = true;
            break;
          }
        }
        if (hit) continue;
      }
      int best = static_cast<unsigned char>(text[i]);
      for (size_t w = 256; w < vocab_.size(); ++w) {
        if (text.substr(i, vocab_[w].size()) == vocab_[w] && vocab_[w].size() > vocab_[best].size()) best = w;
      }
      ids.push_back(best);
      i += vocab_[best].size();
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < static_cast<int32_t>(vocab_.size())) return vocab_[id];
    for (const auto& [name, sid] : specials_) if (sid == id) return name;
    return "";
  }
  int32_t n_vocab() const override { return 1280; }
  int32_t n_base() const override { return 1024; }
  bool is_special(int32_t id) const override { return id >= 1024; }
  std::optional<int32_t> special_id(std::string_view name) const override {
    auto it = specials_.find(std::string(name));
    if (it == specials_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, int32_t> specials_;
  std::vector<std::string> vocab_;
};

// Ids of a hand-written prompt: each item is either a special's name (encoded as its id) or ordinary text
// encoded alone (K3 segment rule). Independent of the code under test.
inline std::vector<int32_t> spell(const Tokenizer& tok, const std::vector<std::string>& items) {
  std::vector<int32_t> ids;
  for (const auto& it : items) {
    if (auto sid = tok.special_id(it)) {
      ids.push_back(*sid);
    } else {
      auto t = tok.encode(it, false);
      ids.insert(ids.end(), t.begin(), t.end());
    }
  }
  return ids;
}

// Feeds `ids` to a fresh parser in chunks cut at `cuts`-random places; returns the parser and events.
struct ParseRun {
  std::unique_ptr<OutputParser> parser;
  std::vector<ChatEvent> events;
};

inline ParseRun parse_chunked(const ChatTemplate& t, const ChatOptions& o, const std::vector<int32_t>& ids,
                              int mode, uint32_t seed = 1) {
  ParseRun r{t.make_parser(o), {}};
  std::mt19937 rng(seed);
  size_t i = 0;
  while (i < ids.size()) {
    size_t n = mode == 0 ? 1 : mode == 1 ? ids.size() : 1 + rng() % 7;
    n = std::min(n, ids.size() - i);
    r.parser->push(std::span<const int32_t>(ids.data() + i, n), r.events);
    i += n;
  }
  r.parser->finish(r.events);
  return r;
}

inline bool valid_utf8(const std::string& s) { return utf8_sanitize(s) == s; }

// Parses `ids` one id at a time, all at once and in random chunks; every run must agree, and the
// events must concatenate to the summary without markers or broken UTF-8.
inline ParsedOutput parse_every_way(const ChatTemplate& tmpl, const ChatOptions& opt,
                                  const std::vector<int32_t>& ids) {
  auto whole = parse_chunked(tmpl, opt, ids, 1);
  const ParsedOutput& w = whole.parser->result();
  for (int mode : {0, 2, 2, 2}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      auto r = parse_chunked(tmpl, opt, ids, mode, seed);
      const ParsedOutput& p = r.parser->result();
      EXPECT_EQ(p.content, w.content);
      EXPECT_EQ(p.reasoning, w.reasoning);
      EXPECT_EQ(p.n_reasoning_tokens, w.n_reasoning_tokens);
      EXPECT_EQ(p.tool_calls.size(), w.tool_calls.size());
      for (size_t i = 0; i < std::min(p.tool_calls.size(), w.tool_calls.size()); ++i) {
        EXPECT_EQ(p.tool_calls[i].id, w.tool_calls[i].id);
        EXPECT_EQ(p.tool_calls[i].name, w.tool_calls[i].name);
        EXPECT_EQ(p.tool_calls[i].arguments, w.tool_calls[i].arguments);
      }
      std::string content, reasoning;
      size_t n_calls = 0;
      for (const ChatEvent& e : r.events) {
        EXPECT_TRUE(valid_utf8(e.text)) << e.text;
        EXPECT_EQ(e.text.find("<|"), std::string::npos) << e.text;
        if (e.kind == ChatEvent::Kind::content) content += e.text;
        if (e.kind == ChatEvent::Kind::reasoning) reasoning += e.text;
        if (e.kind == ChatEvent::Kind::tool_call) {
          EXPECT_EQ(e.index, static_cast<int>(n_calls++));
        }
      }
      EXPECT_EQ(content, p.content);
      EXPECT_EQ(reasoning, p.reasoning);
      EXPECT_EQ(n_calls, p.tool_calls.size());
    }
  }
  return w;
}

}  // namespace k3::test
