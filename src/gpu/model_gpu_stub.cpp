// model_gpu_stub.cpp: the CPU-only build's GpuModel (model_gpu.h): load() says the build has no CUDA; nothing
// else can be reached because no GpuModel or GpuSeqState can be made.
#ifndef K3_HAVE_CUDA
#include "gpu/model_gpu.h"

namespace k3::gpu {

struct GpuModel::Impl {};

GpuModel::GpuModel(const ModelConfig& cfg, const ModelOptions& opt) : cfg_(cfg), opt_(opt) {}
GpuModel::~GpuModel() = default;
Result<std::unique_ptr<GpuModel>> GpuModel::load(const Checkpoint&, const ModelOptions&, int) {
  return error(Code::unsupported, "built without CUDA (configure with -DK3_CUDA=ON)");
}
size_t GpuModel::weight_bytes() const {
  return 0;
}
Result<std::unique_ptr<GpuSeqState>> GpuModel::new_state() {
  return error(Code::unsupported, "built without CUDA");
}
Status GpuModel::forward(GpuSeqState&, const int32_t*, int64_t, std::vector<float>*, bool) {
  return error(Code::unsupported, "built without CUDA");
}
Status GpuModel::forward_batch(std::span<GpuSeqState*>, std::span<const std::span<const int32_t>>,
                               std::vector<std::vector<float>>*) {
  return error(Code::unsupported, "built without CUDA");
}

GpuGraphStats GpuModel::graph_stats() const {
  return {};
}
Status GpuModel::fill_synthetic(GpuSeqState&, int64_t, uint64_t, int64_t) {
  return error(Code::unsupported, "built without CUDA");
}
const char* gpu_module_name(GpuModule m) {
  static const char* names[] = {"embed", "kda", "mla", "moe", "ffn", "norm", "lm_head"};
  return names[int(m)];
}

GpuSeqState::~GpuSeqState() = default;
Status GpuSeqState::reset() {
  return error(Code::unsupported, "built without CUDA");
}
Status GpuSeqState::download(SeqState*) const {
  return error(Code::unsupported, "built without CUDA");
}
Status GpuSeqState::upload(const SeqState&) {
  return error(Code::unsupported, "built without CUDA");
}
int64_t GpuSeqState::bytes() const {
  return 0;
}

}  // namespace k3::gpu
#endif
