// checkpoint.cpp: Checkpoint::open (contract in checkpoint.h).
//
//   1. DIR/config.json -> ModelConfig (io/hf_config)
//   2. DIR/model.safetensors, or every shard named by DIR/model.safetensors.index.json weight_map;
//      every shard must exist and every tensor must sit in the shard the map names (both directions)
//   3. canonical names: language_model.model.X / language_model.X -> model.X,
//      language_model.lm_head.weight -> lm_head.weight; vision_tower.*, mm_projector.* skipped (logged)
//   4. kda.gate_rank = rows of the first KDA layer's f_a_proj.weight
//   5. opt.validate: the manifest (io/manifest) — presence, shape, dtype, A_log tail, MXFP4 scale 255;
//      tensors outside the manifest are tolerated with one warning
#include "io/checkpoint.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/log.h"
#include "io/hf_config.h"
#include "io/manifest.h"
#include "io/safetensors.h"

namespace k3 {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// "" for a vision tensor (skipped), else the canonical name.
std::string canonical_name(const std::string& n) {
  if (starts_with(n, "vision_tower.") || starts_with(n, "mm_projector.")) return "";
  if (n == "language_model.lm_head.weight") return "lm_head.weight";
  if (starts_with(n, "language_model.model.")) return "model." + n.substr(21);
  if (starts_with(n, "language_model.")) return "model." + n.substr(15);
  return n;
}

class CheckpointImpl final : public Checkpoint {
 public:
  const ModelConfig& config() const override { return config_; }
  const std::string& dir() const override { return dir_; }
  const TensorView* find(std::string_view name) const override {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& [n, t] : tensors_) out.push_back(n);
    return out;
  }

  Status load(const std::string& dir, const CheckpointOptions& opt);

 private:
  Result<std::vector<std::string>> shard_list(std::map<std::string, std::string>* weight_map) const;
  Status add_file(const SafetensorsFile& f, const std::map<std::string, std::string>& weight_map,
                  const std::string& shard, size_t* n_vision);

  ModelConfig config_;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView, std::less<>> tensors_;  // canonical name -> view
};

// Shard file names (relative to dir_), and for a sharded checkpoint the weight map (published name -> shard).
Result<std::vector<std::string>> CheckpointImpl::shard_list(
    std::map<std::string, std::string>* weight_map) const {
  const std::string index = dir_ + "/model.safetensors.index.json";
  if (!file_exists(index)) {
    if (file_exists(dir_ + "/model.safetensors")) return std::vector<std::string>{"model.safetensors"};
    return error(Code::not_found, dir_ + ": no model.safetensors or model.safetensors.index.json");
  }
  std::ifstream in(index, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  K3_ASSIGN_OR_RETURN(nlohmann::json j, parse_json_strict(ss.str(), index));
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return error(Code::bad_file, index + ": needs a \"weight_map\" object");
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string())
      return error(Code::bad_file, index + ": weight_map[\"" + it.key() + "\"] is not a string");
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return error(Code::bad_file,
                   index + ": weight_map[\"" + it.key() + "\"] = \"" + shard + "\" is not a file name");
    (*weight_map)[it.key()] = shard;
    shards.insert(shard);
  }
  for (const std::string& s : shards)
    if (!file_exists(dir_ + "/" + s))
      return error(Code::not_found, index + ": shard " + s + " does not exist");
  return std::vector<std::string>(shards.begin(), shards.end());
}

Status CheckpointImpl::add_file(const SafetensorsFile& f,
                                const std::map<std::string, std::string>& weight_map,
                                const std::string& shard, size_t* n_vision) {
  for (const NamedTensor& t : f.tensors()) {
    if (!weight_map.empty()) {
      auto it = weight_map.find(t.name);
      if (it == weight_map.end())
        return error(Code::bad_file, f.path() + ": tensor " + t.name + " is not in the index weight_map");
      if (it->second != shard)
        return error(Code::bad_file, f.path() + ": tensor " + t.name + " is in shard " + shard +
                                         " but the index names " + it->second);
    }
    const std::string name = canonical_name(t.name);
    if (name.empty()) {
      ++*n_vision;
      continue;
    }
    if (!tensors_.emplace(name, t.view).second)
      return error(Code::bad_file, f.path() + ": tensor " + t.name + " duplicates canonical name " + name);
  }
  return ok_status();
}

Status CheckpointImpl::load(const std::string& dir, const CheckpointOptions& opt) {
  dir_ = dir;
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  const std::string cfg_path = dir_ + "/config.json";
  if (!file_exists(cfg_path))
    return error(Code::not_found, cfg_path + ": not found (is " + dir_ + " a checkpoint?)");
  K3_ASSIGN_OR_RETURN(config_, load_hf_config(cfg_path));

  std::map<std::string, std::string> weight_map;
  K3_ASSIGN_OR_RETURN(std::vector<std::string> shards, shard_list(&weight_map));
  size_t n_vision = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    if (opt.progress)
      std::fprintf(stderr, "\rk3: mapping shard %zu/%zu %s", s + 1, shards.size(), shards[s].c_str());
    K3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(dir_ + "/" + shards[s]));
    K3_RETURN_IF_ERROR(add_file(*file, weight_map, shards[s], &n_vision));
    files_.push_back(std::move(file));
  }
  if (opt.progress) std::fprintf(stderr, "\n");
  // Every name in the weight map must have been found in its shard.
  for (const auto& [name, shard] : weight_map) {
    const std::string canon = canonical_name(name);
    if (!canon.empty() && !tensors_.count(canon))
      return error(Code::bad_file, dir_ + "/model.safetensors.index.json: tensor " + name + " is mapped to " +
                                       shard + " but that shard does not contain it");
  }
  if (n_vision > 0)
    K3_LOG_INFO("%s: skipped %zu vision tensors (vision_tower.*, mm_projector.*)", dir_.c_str(), n_vision);

  // KDA gate rank from the first KDA layer's f_a_proj.weight [R, D].
  for (int i = 0; i < config_.n_layer; ++i) {
    if (config_.layer_attn[size_t(i)] != AttnKind::kda) continue;
    if (const TensorView* t = find("model.layers." + std::to_string(i) + ".self_attn.f_a_proj.weight"))
      if (t->ndim() == 2) config_.kda.gate_rank = int(t->dim(0));
    break;
  }
  if (!opt.validate) return ok_status();

  // A config far larger than the files (e.g. a wrong num_experts) would build a huge manifest: stop early.
  int64_t min_expected = 0;
  for (int i = 0; i < config_.n_layer; ++i)
    min_expected += 2 + (config_.layer_moe[size_t(i)] ? 3 * int64_t(config_.moe.n_expert) : 3);
  if (min_expected > 4 * int64_t(tensors_.size()) + 1024)
    return error(Code::bad_file, dir_ + ": config.json implies at least " + std::to_string(min_expected) +
                                     " tensors but the checkpoint holds " + std::to_string(tensors_.size()));
  auto has = [&](const std::string& n) { return find(n) != nullptr; };
  const std::vector<ExpectedTensor> manifest = expected_tensors(config_, has);
  K3_RETURN_IF_ERROR(check_manifest(
      config_, manifest, [&](const std::string& n) { return find(n); }, dir_));
  std::set<std::string> expected;
  for (const ExpectedTensor& e : manifest) expected.insert(e.name);
  std::vector<std::string> extra;
  for (const auto& [n, t] : tensors_)
    if (!expected.count(n)) extra.push_back(n);
  if (!extra.empty())
    K3_LOG_WARN("%s: %zu tensor(s) not used by the model (first: %s)", dir_.c_str(), extra.size(),
                extra[0].c_str());
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir, const CheckpointOptions& opt) {
  auto ck = std::make_unique<CheckpointImpl>();
  K3_RETURN_IF_ERROR(ck->load(dir, opt));
  return std::unique_ptr<Checkpoint>(std::move(ck));
}

}  // namespace k3
