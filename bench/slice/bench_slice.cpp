// bench_slice: the K3 slice (scripts/make_k3_slice.py: K3's full per-layer widths, 4 layers = 3 KDA + 1
// MLA, or DSA with -m31) on one GPU: GPU = CPU checks on a short prompt, then decode time per token at
// batch 1 / 8 / 64 and contexts 4K / 32K / 128K against the byte floor, with the per-module breakdown.
//
//   bench_slice -m DIR [-m31 DIR] [--jsonl F] [--commit C] [--budget-s S] [--batches 1,8,64]
//               [--contexts 4096,32768,131072] [--steps N] [--no-check] [--no-decode] [--profile-step]
//
// check (per model): 8 tokens, one prefill call. fp32: GPU logits vs CPU logits (goal NMSE <= 1e-6). bf16:
//   every named intermediate of every layer vs the CPU's at the same rounding points, each GPU layer fed the
//   CPU's input (GpuModel::set_layer_inputs; goal NMSE <= 1e-4 for each).
// decode (per model, batch B, context T): B sequences made to hold T tokens WITHOUT a prefill
//   (GpuModel::fill_synthetic: random KDA states, conv windows, latent / index-key cache rows), then decode
//   steps of one token per sequence with CUDA graphs (the default path) and eagerly, median wall time per
//   step (host to host, logits copied back); one more eager step with CUDA events around every piece gives
//   the per-module breakdown. Byte floor = the bytes a step must read / the copy bandwidth measured here
//   (2 GiB cudaMemcpy device to device, read + write bytes): every non-expert weight, the routed experts
//   (one expert's bytes x the expected distinct experts E (1 - (1 - k/E)^B) per MoE layer), B embedding
//   rows, and per sequence the KDA states (fp32 S) and the attention cache in its K3 format (bf16 latent
//   rows of 576; DSA: bf16 index keys of all T positions plus 576-wide rows of the top-k selected ones).
// --profile-step: after the first combination's timings, one more eager step between cudaProfilerStart and
//   cudaProfilerStop, for `ncu --profile-from-start off` (scripts/device/ncu_step.py sums its kernels).
// Combinations run cheapest first; one whose single step would overrun --budget-s is skipped (said so).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench_slice.h"

using namespace slice;

namespace {

// Copy bandwidth: bytes read + written per second of a 2 GiB device-to-device cudaMemcpy (median of 5).
double copy_bandwidth() {
  const size_t n = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaMemset(a, 1, n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) t.push_back(ms * 1e-3);
  }
  cudaFree(a), cudaFree(b);
  return 2.0 * double(n) / median(t);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (k == "-m") a.m3 = next();
    else if (k == "-m31") a.m31 = next();
    else if (k == "--jsonl") a.jsonl = next();
    else if (k == "--commit") a.commit = next();
    else if (k == "--budget-s") a.budget_s = std::stod(next());
    else if (k == "--batches") a.batches = parse_list(next());
    else if (k == "--contexts") a.contexts = parse_list(next());
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--no-check") a.check = false;
    else if (k == "--no-decode") a.decode = false;
    else if (k == "--profile-step") a.profile_step = true;
    else {
      std::fprintf(stderr, "bench_slice: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  const double t0 = now_s();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "bench_slice: no CUDA device\n");
    return 1;
  }
  Out out{a, prop.name};
  const double bw = copy_bandwidth();
  std::printf("copy bandwidth %.1f GB/s (2 GiB D2D, read + write)\n", bw / 1e9);
  out.line("device", "copy bandwidth", bw / 1e9, "GB/s");
  int rc = 0;
  for (const auto& [name, dir] : {std::pair<std::string, std::string>{"k3", a.m3}, {"k31", a.m31}}) {
    if (dir.empty()) continue;
    if (now_s() - t0 > a.budget_s) {
      std::printf("%s: skipped, budget spent\n", name.c_str());
      continue;
    }
    rc |= run_model(a, out, name, dir, bw, t0);
  }
  std::printf("bench_slice done in %.1f s\n", now_s() - t0);
  return rc;
}
