// k3 logits: runs the model over a token sequence and writes every position's logits to a .npy file.
//
//   k3 logits -m DIR (--tokens 1,2,3 | --tokens-file F.npy | -p TEXT) -o OUT.npy
//             [--precision fp32|bf16] [--decode-path] [--chunk N] [--mla absorbed|unabsorbed] [-t THREADS]
//             [--device cpu|cuda] [--trace-out DIR [--dump NAME]...]
//
// OUT.npy: float32 [T, n_vocab], row t = logits after token t. One-shot prefill by default; --decode-path
// feeds one token per call; --chunk N prefills in pieces of N (each continuing from the state). The tokens
// file is a 1-D (or [1, T]) .npy of int32/int64/uint32. -p encodes TEXT with DIR's tokenizer (no specials).
// --trace-out DIR (CPU only) writes the model's named intermediates (ModelOptions::trace) as
// DIR/<name>-L<layer>.npy, float32 [T, n per token] over all forward calls (1-D when a call's size is not a
// multiple of its tokens); --dump NAME (repeatable) keeps only those names, e.g. --dump dsa_sel: the DSA
// selected positions [T, topk], -1 for unused.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "engine/npy.h"
#include "gpu/model_gpu.h"
#include "model/model.h"

namespace k3::cli {
namespace {

Result<std::vector<int32_t>> read_npy_tokens(const std::string& path) {
  K3_ASSIGN_OR_RETURN(NpyArray arr, read_npy(path));
  if (arr.type != NpyType::i32) return error(Code::unsupported, path + ": token dtype must be <i4, <i8 or <u4");
  return std::move(arr.i32);  // any shape, read in C order
}

Result<std::vector<int32_t>> parse_token_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      out.push_back(int32_t(v));
    } catch (const std::exception&) {
      return error(Code::invalid_argument, "--tokens: not an integer: '" + item + "'");
    }
  }
  return out;
}

struct Args {
  std::string model, tokens, tokens_file, prompt, out, precision = "fp32", mla, device = "cpu", trace_out;
  std::vector<std::string> dump;
  bool decode_path = false;
  int chunk = 0, threads = 0;
};

// Collects traced intermediates per (name, layer), one forward call after another.
struct TraceSink {
  std::set<std::string> names;  // empty: every name
  int64_t n_tok = 0;            // tokens of the current forward call
  std::map<std::pair<std::string, int>, std::vector<float>> data;
  std::map<std::pair<std::string, int>, int64_t> width;  // per-token width; 0: not per token (1-D)

  void add(const char* name, int layer, const float* x, int64_t n) {
    if (!names.empty() && !names.count(name)) return;
    const auto key = std::make_pair(std::string(name), layer);
    const int64_t w = (n_tok > 0 && n % n_tok == 0) ? n / n_tok : 0;
    auto it = width.find(key);
    if (it == width.end())
      width[key] = w;
    else if (it->second != w)
      it->second = 0;
    auto& d = data[key];
    d.insert(d.end(), x, x + n);
  }

  Status write(const std::string& dir) const {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return error(Code::invalid_argument, "--trace-out " + dir + ": " + ec.message());
    for (const auto& [key, d] : data) {
      const int64_t w = width.at(key);
      const std::vector<int64_t> shape =
          w > 0 ? std::vector<int64_t>{int64_t(d.size()) / w, w} : std::vector<int64_t>{int64_t(d.size())};
      const std::string path = dir + "/" + key.first + "-L" + std::to_string(key.second) + ".npy";
      K3_RETURN_IF_ERROR(write_npy(path, d.data(), shape));
    }
    return ok_status();
  }
};

Status run(const Args& a) {
  int n_src = !a.tokens.empty() + !a.tokens_file.empty() + !a.prompt.empty();
  if (n_src != 1) return error(Code::invalid_argument, "give exactly one of --tokens, --tokens-file, -p");
  ModelOptions opt;
  if (a.precision == "bf16")
    opt.precision = Precision::bf16;
  else if (a.precision != "fp32")
    return error(Code::invalid_argument, "--precision must be fp32 or bf16");
  if (a.mla == "absorbed")
    opt.mla = MlaPath::absorbed;
  else if (a.mla == "unabsorbed")
    opt.mla = MlaPath::unabsorbed;
  else if (!a.mla.empty())
    return error(Code::invalid_argument, "--mla must be absorbed or unabsorbed");
  if (a.chunk < 0) return error(Code::invalid_argument, "--chunk must be positive");
  opt.n_threads = a.threads;
  TraceSink sink;
  if (!a.trace_out.empty()) {
    if (a.device != "cpu") return error(Code::invalid_argument, "--trace-out: CPU only (--device cpu)");
    sink.names.insert(a.dump.begin(), a.dump.end());
    opt.trace = [&sink](const char* name, int layer, const float* x, int64_t n) {
      sink.add(name, layer, x, n);
    };
  } else if (!a.dump.empty()) {
    return error(Code::invalid_argument, "--dump needs --trace-out DIR");
  }

  std::vector<int32_t> tokens;
  if (!a.tokens.empty()) {
    K3_ASSIGN_OR_RETURN(tokens, parse_token_list(a.tokens));
  } else if (!a.tokens_file.empty()) {
    K3_ASSIGN_OR_RETURN(tokens, read_npy_tokens(a.tokens_file));
  } else {
    K3_ASSIGN_OR_RETURN(auto tok, Tokenizer::open(a.model));
    tokens = tok->encode(a.prompt, false);
  }
  if (tokens.empty()) return error(Code::invalid_argument, "no tokens");

  K3_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open(a.model));
  if (a.device != "cpu" && a.device != "cuda") return error(Code::invalid_argument, "--device must be cpu or cuda");
  std::unique_ptr<Model> model;
  std::unique_ptr<SeqState> state;
  std::unique_ptr<gpu::GpuModel> gmodel;
  std::unique_ptr<gpu::GpuSeqState> gstate;
  if (a.device == "cuda") {
    K3_ASSIGN_OR_RETURN(gmodel, gpu::GpuModel::load(*ckpt, opt));
    K3_ASSIGN_OR_RETURN(gstate, gmodel->new_state());
  } else {
    K3_ASSIGN_OR_RETURN(model, Model::load(*ckpt, opt));
    state = model->new_state();
  }
  const int64_t T = int64_t(tokens.size()), V = ckpt->config().n_vocab;
  std::vector<float> all, part;
  all.reserve(size_t(T * V));
  const int64_t step = a.decode_path ? 1 : (a.chunk > 0 ? a.chunk : T);
  for (int64_t t0 = 0; t0 < T; t0 += step) {
    const int64_t n = std::min(step, T - t0);
    sink.n_tok = n;
    K3_RETURN_IF_ERROR(gmodel ? gmodel->forward(*gstate, tokens.data() + t0, n, &part, true)
                              : model->forward(*state, tokens.data() + t0, n, &part, true));
    all.insert(all.end(), part.begin(), part.end());
  }
  K3_RETURN_IF_ERROR(write_npy(a.out, all.data(), {T, V}));
  return a.trace_out.empty() ? ok_status() : sink.write(a.trace_out);
}

}  // namespace

void add_logits(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("logits", "write per-position logits of a token sequence to a .npy file");
  cmd->add_option("-m,--model", args->model, "checkpoint directory")->required();
  cmd->add_option("--tokens", args->tokens, "comma-separated token ids");
  cmd->add_option("--tokens-file", args->tokens_file, ".npy file of token ids (1-D int32/int64)");
  cmd->add_option("-p,--prompt", args->prompt, "text, encoded with the checkpoint's tokenizer");
  cmd->add_option("-o,--output", args->out, "output .npy (float32 [T, n_vocab])")->required();
  cmd->add_option("--precision", args->precision, "fp32 | bf16 (default fp32)");
  cmd->add_flag("--decode-path", args->decode_path, "feed one token per forward call");
  cmd->add_option("--chunk", args->chunk, "prefill in pieces of N tokens");
  cmd->add_option("--mla", args->mla, "force the MLA path: absorbed | unabsorbed");
  cmd->add_option("-t,--threads", args->threads, "threads (default: all cores)");
  cmd->add_option("--device", args->device, "cpu | cuda (default cpu)");
  cmd->add_option("--trace-out", args->trace_out,
                  "write named intermediates as DIR/<name>-L<layer>.npy (CPU)");
  cmd->add_option("--dump", args->dump, "with --trace-out: only this name (repeatable), e.g. dsa_sel");
  cmd->callback([args] {
    Status s = run(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "k3 logits: %s\n", s.message().c_str());
      exit_code() = 1;
    }
  });
}

}  // namespace k3::cli
