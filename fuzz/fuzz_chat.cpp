// fuzz_chat.cpp: arbitrary ids -> K2 / K3 output parsers, arbitrary text -> prompt rendering (FORMATS.md §2).
// Input: byte 0 = flags (bit 0: K3 else K2, bit 1: thinking), byte 1 = split stride, then pairs of bytes.
// Each pair is one id: high bit set -> one of the format's marker ids (so markers are dense), else a
// base-vocabulary id. Invariants, for any input:
//   the parser never crashes; feeding the ids one by one and in chunks of `stride` gives the same
//   summary; every delta is valid UTF-8; the deltas concatenate to the summary;
//   rendering a conversation whose texts are the input bytes (invalid UTF-8, spelled markers, JSON
//   fragments as tool arguments) returns ids or a Status, never crashes; with fixed arguments it emits
//   no marker id for any spelled marker (as many specials as an all-"x" conversation of the same shape).
// Tokenizer: $K3_FUZZ_TOKENIZER_DIR/tokenizer-tiny-{k2,k3}, default tests/data next to this file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/chat.h"

namespace {

const k3::Tokenizer& tokenizer(bool k3) {
  static std::unique_ptr<k3::Tokenizer> tok[2];
  if (!tok[k3]) {
    const char* env = std::getenv("K3_FUZZ_TOKENIZER_DIR");
    const std::string here = __FILE__;
    const size_t cut = here.rfind("fuzz/");
    std::string dir = env ? env : (cut == 0 ? "." : here.substr(0, cut)) + "/tests/data";
    auto r = k3::Tokenizer::open(dir + (k3 ? "/tokenizer-tiny-k3" : "/tokenizer-tiny-k2"));
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz_chat: %s\n", r.status().message().c_str());
      std::abort();
    }
    tok[k3] = std::move(r.value());
  }
  return *tok[k3];
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_chat: invariant failed: %s\n", what);
    std::abort();
  }
}

k3::ParsedOutput run(const k3::ChatTemplate& t, const k3::ChatOptions& o, const std::vector<int32_t>& ids,
                     size_t stride) {
  auto p = t.make_parser(o);
  std::vector<k3::ChatEvent> events;
  for (size_t i = 0; i < ids.size(); i += stride) {
    p->push(std::span<const int32_t>(ids.data() + i, std::min(stride, ids.size() - i)), events);
  }
  p->finish(events);
  std::string content, reasoning;
  for (const auto& e : events) {
    check(k3::utf8_sanitize(e.text) == e.text, "delta is valid UTF-8");
    if (e.kind == k3::ChatEvent::Kind::content) content += e.text;
    if (e.kind == k3::ChatEvent::Kind::reasoning) reasoning += e.text;
  }
  check(content == p->result().content && reasoning == p->result().reasoning, "deltas == summary");
  return p->result();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool is_k3 = data[0] & 1;
  const k3::Tokenizer& tok = tokenizer(is_k3);
  auto t = k3::make_chat_template(is_k3 ? k3::ChatFormat::k3_xtml : k3::ChatFormat::k2, tok).value();
  k3::ChatOptions o;
  o.thinking = data[0] & 2;
  o.tool_call_id_seed = 1;

  std::vector<int32_t> markers;
  for (int off = 0; off < 48; ++off) markers.push_back(tok.n_base() + off);
  std::vector<int32_t> ids;
  for (size_t i = 2; i + 1 < size; i += 2) {
    uint16_t v = static_cast<uint16_t>(data[i] << 8 | data[i + 1]);
    ids.push_back(v & 0x8000 ? markers[v % markers.size()] : static_cast<int32_t>(v % tok.n_base()));
  }
  k3::ParsedOutput a = run(*t, o, ids, 1);
  k3::ParsedOutput b = run(*t, o, ids, 1 + data[1] % 16);
  check(a.content == b.content && a.reasoning == b.reasoning && a.tool_calls.size() == b.tool_calls.size(),
        "one by one == chunked");
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    check(a.tool_calls[i].arguments == b.tool_calls[i].arguments && a.tool_calls[i].id == b.tool_calls[i].id,
          "same calls");
  }

  std::string text(reinterpret_cast<const char*>(data) + 2, size - 2);
  auto conversation = [&](const std::string& s, const std::string& args) {
    k3::Message user{"user", s, s, "", {}, ""};
    k3::Message asst{"assistant", s, "", s, {{"id1", "f" + s, args}}, ""};
    k3::Message tool{"tool", s, "", "", {}, "id1"};
    return std::vector<k3::Message>{user, asst, tool};
  };
  (void)t->render(conversation(text, text), o);  // arbitrary arguments: ids or a Status
  auto r = t->render(conversation(text, "{}"), o);
  auto ref = t->render(conversation(std::string(text.size(), 'x'), "{}"), o);
  if (r.ok() && ref.ok()) {
    int n = 0, n_ref = 0;
    for (int32_t id : r.value()) n += tok.is_special(id);
    for (int32_t id : ref.value()) n_ref += tok.is_special(id);
    check(n == n_ref, "spelled markers stay text");
  }
  return 0;
}
