// k3 tokenize / k3 detokenize: the tokenizer from the command line (FORMATS.md §1).
//
//   k3 tokenize -m DIR (-p TEXT | -f FILE) [--special] [--jsonl]
//     prints the ids of TEXT (or of FILE's raw bytes, "-" = stdin) comma-separated on one line.
//     --special: special spellings ("<|im_end|>") become their ids; otherwise they are plain text.
//     --jsonl: every input line is a JSON string; every output line is the JSON array of its ids (batch mode).
//   k3 detokenize -m DIR --ids 1,2,3
//     writes the decoded bytes exactly (no newline added; specials render as their names).
// DIR is a model directory or a tokenizer directory holding tiktoken.model + tokenizer_config.json.
// Invalid UTF-8 input is replaced like Python's bytes.decode("utf-8", "replace") before encoding.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "io/tokenizer.h"

namespace k3::cli {
namespace {

struct TokenizeArgs {
  std::string dir, prompt, file, ids;
  bool special = false, jsonl = false;
};

bool read_input(const TokenizeArgs& a, std::string& out) {
  if (!a.file.empty()) {
    if (a.file == "-") {
      out.assign(std::istreambuf_iterator<char>(std::cin), {});
      return true;
    }
    std::ifstream f(a.file, std::ios::binary);
    if (!f) return std::fprintf(stderr, "k3 tokenize: cannot open %s\n", a.file.c_str()), false;
    std::ostringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    return true;
  }
  out = a.prompt;
  return true;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

int run_tokenize(const TokenizeArgs& a) {
  auto tok = Tokenizer::open(a.dir);
  if (!tok.ok()) return std::fprintf(stderr, "k3 tokenize: %s\n", tok.status().message().c_str()), 1;
  std::string input;
  if (!read_input(a, input)) return 1;
  if (!a.jsonl) {
    std::printf("%s\n", join_ids((*tok)->encode(input, a.special)).c_str());
    return 0;
  }
  std::istringstream lines(input);
  std::string line, out;
  for (size_t n = 1; std::getline(lines, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string())
      return std::fprintf(stderr, "k3 tokenize: input line %zu is not a JSON string\n", n), 1;
    out += "[" + join_ids((*tok)->encode(j.get<std::string>(), a.special)) + "]\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int run_detokenize(const TokenizeArgs& a) {
  auto tok = Tokenizer::open(a.dir);
  if (!tok.ok()) return std::fprintf(stderr, "k3 detokenize: %s\n", tok.status().message().c_str()), 1;
  std::vector<int32_t> ids;
  std::stringstream ss(a.ids);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (item.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument(item);
      if (v < 0 || v >= (*tok)->n_vocab())
        return std::fprintf(stderr, "k3 detokenize: id %ld outside 0..%d\n", v, (*tok)->n_vocab() - 1), 1;
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return std::fprintf(stderr, "k3 detokenize: bad id '%s'\n", item.c_str()), 1;
    }
  }
  const std::string text = (*tok)->decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* tok = app.add_subcommand("tokenize", "Print the token ids of a text");
  tok->add_option("-m,--model", args->dir, "model or tokenizer directory (tiktoken.model inside)")->required();
  auto* p = tok->add_option("-p,--prompt", args->prompt, "text to encode");
  auto* f = tok->add_option("-f,--file", args->file, "file to encode (raw bytes; - = stdin)");
  p->excludes(f);
  tok->add_flag("--special", args->special, "special spellings in the text become special ids");
  tok->add_flag("--jsonl", args->jsonl, "each input line is a JSON string; print one JSON id array per line");
  tok->callback([args, p, f] {
    if (!*p && !*f) {
      std::fprintf(stderr, "k3 tokenize: give -p TEXT or -f FILE\n");
      exit_code() = 2;
      return;
    }
    exit_code() = run_tokenize(*args);
  });

  auto* detok = app.add_subcommand("detokenize", "Print the text of token ids");
  detok->add_option("-m,--model", args->dir, "model or tokenizer directory (tiktoken.model inside)")->required();
  detok->add_option("--ids", args->ids, "comma-separated token ids")->required();
  detok->callback([args] { exit_code() = run_detokenize(*args); });
}

}  // namespace k3::cli
