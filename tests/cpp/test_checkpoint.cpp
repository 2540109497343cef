// test_checkpoint.cpp: safetensors parsing/validation, Checkpoint::open on the tiny models and on
// broken copies of them (every bad input must give a clear error naming the file and tensor).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Blob {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A safetensors image; every tensor starts 8-byte aligned (gaps are allowed by the format).
std::string make_st(const std::vector<Blob>& blobs) {
  json h = json::object();
  std::string data;
  for (const Blob& b : blobs) {
    data.resize((data.size() + 7) / 8 * 8, '\0');
    h[b.name] = {{"dtype", b.dtype},
                 {"shape", b.shape},
                 {"data_offsets", {data.size(), data.size() + b.bytes.size()}}};
    data += b.bytes;
  }
  std::string hs = h.dump();
  hs.resize((hs.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(hs.size()) >> (8 * i)) & 0xff);
  return out + hs + data;
}

// Raw image from a header string and a data region.
std::string raw_st(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

Status parse(const std::string& img) {
  return parse_safetensors(img.data(), img.size(), "t.safetensors").status();
}

void expect_error(const Status& st, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(st.ok());
  for (const char* p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}

TEST(Safetensors, ParsesViewsIntoTheBuffer) {
  float v[3] = {1.f, -2.f, 0.5f};
  std::string img = make_st({{"a", "F32", {3}, std::string(reinterpret_cast<char*>(v), 12)},
                             {"b", "U8", {2, 2}, std::string("\x01\x02\x03\x04", 4)}});
  auto r = parse_safetensors(img.data(), img.size(), "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  const NamedTensor& a = (*r)[0].name == "a" ? (*r)[0] : (*r)[1];
  EXPECT_EQ(a.view.dtype, DType::f32);
  EXPECT_EQ(a.view.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(a.view.as<float>()[1], -2.f);
  EXPECT_GE(static_cast<const char*>(a.view.data), img.data());
  EXPECT_LT(static_cast<const char*>(a.view.data), img.data() + img.size());
}

TEST(Safetensors, MetadataAllowedButMustBeAnObject) {
  EXPECT_TRUE(
      parse(raw_st(R"({"__metadata__":{"format":"pt"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                   2))
          .ok());
  expect_error(parse(raw_st(R"({"__metadata__":[1]})", 0)), {"t.safetensors", "__metadata__"});
}

TEST(Safetensors, TruncatedHeader) {
  expect_error(parse(std::string("\x10\x00\x00", 3)), {"t.safetensors", "too short"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  std::string img = raw_st("{}", 0);
  img[0] = char(200);
  expect_error(parse(img), {"header length 200", "beyond the file size"});
  img[0] = 0, img[6] = 1;  // 2^48: over the 100 MB limit
  expect_error(parse(img), {"100 MB"});
}

TEST(Safetensors, InvalidJson) {
  expect_error(parse(raw_st(R"({"x": {"dtype": "U8", )", 0)), {"t.safetensors", "not valid JSON"});
  expect_error(parse(raw_st("[1, 2]", 0)), {"not a JSON object"});
}

TEST(Safetensors, OffsetsOutsideTheFile) {
  expect_error(parse(raw_st(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 8)),
               {"tensor \"w\"", "beyond the data region"});
  expect_error(parse(raw_st(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", 8)),
               {"\"w\"", "begin 5 > end 4"});
}

TEST(Safetensors, SizeMismatchAndOverlap) {
  expect_error(parse(raw_st(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 16)),
               {"\"w\"", "[2, 3] BF16 needs 12 bytes", "span 8"});
  expect_error(parse(raw_st(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                            16)),
               {"\"a\"", "\"b\"", "overlap"});
  // A product of dimensions that overflows 64 bits must not wrap around to the span.
  expect_error(
      parse(raw_st(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0)),
      {"\"w\""});
}

TEST(Safetensors, DuplicateNamesUnknownDtypeMisaligned) {
  expect_error(parse(raw_st(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                            8)),
               {"duplicate key \"w\""});
  expect_error(parse(raw_st(R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})", 8)),
               {"\"w\"", "unknown dtype \"Q4_K\""});
  expect_error(parse(raw_st(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 8)),
               {"non-negative"});
  std::string h = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  h.resize((h.size() + 7) / 8 * 8, ' ');
  expect_error(parse(raw_st(h, 8)), {"\"w\"", "not aligned"});
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto r = SafetensorsFile::open("/nonexistent/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found);
  EXPECT_NE(r.status().message().find("/nonexistent/x.safetensors"), std::string::npos);
}

// ---------------------------------------------------------------- checkpoints
class CheckpointTest : public ::testing::Test {
 protected:
  std::string model(const char* name) { return std::string(K3_SOURCE_DIR) + "/models/" + name; }
  // A scratch copy of a tiny model.
  std::string copy_of(const char* name) {
    tmp_ = fs::temp_directory_path() /
           ("k3_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(tmp_);
    fs::copy(model(name), tmp_, fs::copy_options::recursive);
    return tmp_.string();
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }
  // Rewrites a safetensors file after `edit` changes its tensor list.
  static void rewrite(const std::string& path, const std::function<void(std::vector<Blob>&)>& edit) {
    std::vector<Blob> blobs;
    {
      auto f = SafetensorsFile::open(path);
      ASSERT_TRUE(f.ok()) << f.status().message();
      for (const NamedTensor& t : (*f)->tensors())
        blobs.push_back({t.name, std::string(dtype_name(t.view.dtype)), t.view.shape,
                         std::string(static_cast<const char*>(t.view.data), t.view.nbytes)});
    }
    edit(blobs);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << make_st(blobs);
  }
  static Blob* find(std::vector<Blob>& blobs, const std::string& name) {
    for (Blob& b : blobs)
      if (b.name == name) return &b;
    ADD_FAILURE() << "no tensor " << name;
    static Blob dummy;
    return &dummy;
  }
  static Status open_status(const std::string& dir) { return Checkpoint::open(dir).status(); }
  fs::path tmp_;
};

TEST_F(CheckpointTest, TinyModelsOpenWithTheirLayerMaps) {
  struct Case {
    const char* name;
    Family family;
    std::string attn;  // K = KDA, M = MLA, D = DSA per layer
  };
  for (const Case& c :
       {Case{"tiny-kl", Family::kimi_linear, "KKKMKM"}, Case{"tiny-k3", Family::k3, "KKKMKKKM"},
        Case{"tiny-k31", Family::k3_1, "KKKDKKKD"}}) {
    auto ck = Checkpoint::open(model(c.name));
    ASSERT_TRUE(ck.ok()) << c.name << ": " << ck.status().message();
    const ModelConfig& cfg = (*ck)->config();
    EXPECT_EQ(cfg.family, c.family);
    ASSERT_EQ(cfg.layer_attn.size(), c.attn.size());
    for (size_t i = 0; i < c.attn.size(); ++i) {
      const char want = c.attn[i];
      const AttnKind k = want == 'K' ? AttnKind::kda : want == 'M' ? AttnKind::mla : AttnKind::dsa;
      EXPECT_EQ(cfg.layer_attn[i], k) << c.name << " layer " << i;
      EXPECT_EQ(cfg.layer_moe[i], i >= 1) << c.name << " layer " << i;
    }
    EXPECT_EQ(cfg.kda.gate_rank, 16) << c.name;
    // Canonical names only; vision tensors dropped.
    const TensorView* lm = (*ck)->find("lm_head.weight");
    ASSERT_NE(lm, nullptr) << c.name;
    EXPECT_EQ(lm->shape, (std::vector<int64_t>{1280, 64}));
    ASSERT_NE((*ck)->find("model.layers.0.self_attn.A_log"), nullptr);
    EXPECT_EQ((*ck)->find("model.layers.0.self_attn.A_log")->dtype, DType::f32);
    for (const std::string& n : (*ck)->names()) {
      EXPECT_EQ(n.find("language_model"), std::string::npos) << n;
      EXPECT_EQ(n.find("vision_tower"), std::string::npos) << n;
    }
  }
  auto k3 = Checkpoint::open(model("tiny-k3"));
  ASSERT_TRUE(k3.ok());
  const TensorView* p = (*k3)->find("model.layers.1.block_sparse_moe.experts.3.w2.weight_packed");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->dtype, DType::u8);
  EXPECT_EQ(p->shape, (std::vector<int64_t>{32, 16}));  // [latent, d_ff / 2]
  EXPECT_TRUE((*k3)->config().moe.experts_mxfp4);
}

TEST_F(CheckpointTest, MissingConfigOrWeights) {
  const std::string d = copy_of("tiny-kl");
  fs::remove(d + "/model.safetensors");
  expect_error(open_status(d), {"no model.safetensors"});
  fs::remove(d + "/config.json");
  auto st = open_status(d);
  expect_error(st, {"config.json", "not found"});
  EXPECT_EQ(st.code(), Code::not_found);
}

TEST_F(CheckpointTest, MissingWrongShapeWrongDtypeAllReported) {
  const std::string d = copy_of("tiny-kl");
  rewrite(d + "/model.safetensors", [](std::vector<Blob>& b) {
    std::erase_if(b, [](const Blob& x) { return x.name == "model.layers.2.self_attn.f_b_proj.weight"; });
    Blob* q = find(b, "model.layers.3.self_attn.kv_b_proj.weight");
    q->shape = {32, 64};  // was [64, 32]
    Blob* bias = find(b, "model.layers.1.block_sparse_moe.gate.e_score_correction_bias");
    bias->dtype = "BF16", bias->shape = {16};  // same bytes, fp32 -> bf16
  });
  auto st = open_status(d);
  expect_error(st, {"3 problem(s)", "missing model.layers.2.self_attn.f_b_proj.weight",
                    "model.layers.3.self_attn.kv_b_proj.weight is [32, 64] BF16, expected [64, 32] BF16",
                    "e_score_correction_bias is [16] BF16, expected [8] F32"});
}

TEST_F(CheckpointTest, ExtraTensorsAreTolerated) {
  const std::string d = copy_of("tiny-kl");
  rewrite(d + "/model.safetensors", [](std::vector<Blob>& b) {
    b.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, std::string(8, '\0')});
  });
  auto ck = Checkpoint::open(d);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_NE((*ck)->find("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);
}

TEST_F(CheckpointTest, NonzeroALogTailAndNanScale) {
  const std::string d = copy_of("tiny-k3");
  rewrite(d + "/model-00001-of-00002.safetensors", [](std::vector<Blob>& b) {
    Blob* a = find(b, "language_model.model.layers.1.self_attn.A_log");
    const float one = 1.f;
    std::memcpy(a->bytes.data() + 4 * 5, &one, 4);  // entry 5 >= num_heads = 2
    Blob* s = find(b, "language_model.model.layers.2.block_sparse_moe.experts.4.w3.weight_scale");
    s->bytes[7] = char(0xff);
  });
  auto st = open_status(d);
  expect_error(
      st, {"2 problem(s)", "model.layers.1.self_attn.A_log: A_log[5]", "nonzero",
           "model.layers.2.block_sparse_moe.experts.4.w3.weight_scale: MXFP4 scale byte 255", "offset 7"});
  auto no_check = Checkpoint::open(d, CheckpointOptions{.validate = false});
  EXPECT_TRUE(no_check.ok()) << no_check.status().message();
}

TEST_F(CheckpointTest, Mxfp4OrBf16ExpertsByTensorSuffix) {
  const std::string d = copy_of("tiny-k3");
  // Expert 0 of layer 1 stored as bf16 `.weight` instead of MXFP4: accepted, dispatched on the suffix.
  rewrite(d + "/model-00001-of-00002.safetensors", [](std::vector<Blob>& b) {
    const std::string p = "language_model.model.layers.1.block_sparse_moe.experts.0.";
    for (const char* w : {"w1", "w3", "w2"}) {
      std::erase_if(b, [&](const Blob& x) { return x.name.rfind(p + w + ".weight_", 0) == 0; });
      b.push_back({p + w + ".weight", "BF16", {32, 32}, std::string(32 * 32 * 2, '\0')});
    }
  });
  json idx = json::parse(std::ifstream(d + "/model.safetensors.index.json"));
  for (const char* w : {"w1", "w3", "w2"}) {
    const std::string p = std::string("language_model.model.layers.1.block_sparse_moe.experts.0.") + w;
    idx["weight_map"].erase(p + ".weight_packed");
    idx["weight_map"].erase(p + ".weight_scale");
    idx["weight_map"][p + ".weight"] = "model-00001-of-00002.safetensors";
  }
  std::ofstream(d + "/model.safetensors.index.json", std::ios::trunc) << idx.dump();
  auto ck = Checkpoint::open(d);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->find("model.layers.1.block_sparse_moe.experts.0.w2.weight")->dtype, DType::bf16);
}

TEST_F(CheckpointTest, ShardIndexConsistency) {
  const std::string d = copy_of("tiny-k3");
  const std::string idx_path = d + "/model.safetensors.index.json";
  json idx = json::parse(std::ifstream(idx_path));
  // A tensor the map places in the wrong shard.
  json moved = idx;
  moved["weight_map"]["language_model.model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(idx_path, std::ios::trunc) << moved.dump();
  expect_error(open_status(d), {"language_model.model.embed_tokens.weight",
                                "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
  // A shard that does not exist.
  std::ofstream(idx_path, std::ios::trunc) << idx.dump();
  fs::remove(d + "/model-00002-of-00002.safetensors");
  expect_error(open_status(d), {"shard model-00002-of-00002.safetensors does not exist"});
}

}  // namespace
}  // namespace k3
