// manifest.json of an export folder (seer_trt/contracts/manifest.py, docs/DESIGN.md "Graphs and their contract"): what the runtime needs of it.
//
// In:  the folder's manifest.json (schema 2.x; another major version is refused with the fix).
// Out: Manifest: model dims, vision settings, special ids, Seer calibration, generation defaults, graphs with
//      their inputs and outputs, length buckets, the shared weights file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "seer/seer.hpp"

namespace seer {

inline Error config_error(const std::string& m) { return Error(Error::Kind::Config, m); }
inline Error input_error(const std::string& m) { return Error(Error::Kind::Input, m); }
inline Error manifest_error(const std::string& m) { return Error(Error::Kind::Manifest, m); }

constexpr int SCHEMA_MAJOR = 2;

struct Axis {
  std::string name;  // a dynamic axis ("batch", "prompt", "answer", "seq", "tiles", "tokens"), or ""
  int64_t size = -1; // a fixed size, or -1
};

struct TensorSpec {
  std::string name;
  std::string dtype;  // "float32" | "float16" | "int64" | "int32"
  std::vector<Axis> shape;
};

struct GraphEntry {
  std::string name, file, precision;
  std::vector<TensorSpec> inputs, outputs;
  const TensorSpec* output(const std::string& n) const;
};

struct SeerConfig {
  std::string signal = "mlp_sparsity";  // mlp_sparsity | probe | end_token_prob
  std::string statistic = "abs_below";
  int64_t probe_layer = 3;
  std::string direction = "up";
  double tau_jump = 0.03, gamma = 0.6, threshold = 0.5;
  int64_t window = 3, margin = 1;
  std::string detector;  // jump | threshold
  std::string label = "paper";
  bool full_depth() const { return signal == "end_token_prob"; }
};

struct GenerationConfig {
  int64_t gen_length = 128, steps = 128, block_length = 128;
  double temperature = 0.0;
  std::string remasking = "low_confidence";
  int64_t num_blocks() const { return gen_length / block_length; }
  void validate() const;  // seer_trt.contracts.config.GenerationConfig.__post_init__; throws config_error
  bool operator<(const GenerationConfig& o) const;
  bool operator==(const GenerationConfig& o) const;
};

struct SpecialTokens {
  int64_t mask_id, endoftext_id, startoftext_id, eot_id, start_header_id, end_header_id;
};

struct Buckets {
  std::vector<int64_t> batch, prompt, answer;
};

struct VisionInfo {
  int64_t image_size = 0, patch_size = 0, tokens_per_tile = 0;
  std::string image_aspect_ratio, newline;
  std::optional<int64_t> anyres_max_tiles;
  bool anyres() const { return image_aspect_ratio.rfind("anyres", 0) == 0; }
};

struct WeightsInfo {
  std::string file, index;
  int64_t size_bytes = 0;
};

struct Manifest {
  std::string schema_version;
  int64_t hidden_size = 0, vocab_size = 0;
  VisionInfo vision;
  SpecialTokens special{};
  std::string tokenizer;  // folder, relative to the manifest
  SeerConfig seer;
  GenerationConfig generation;
  std::string precision;  // float32 | float16
  std::map<std::string, GraphEntry> graphs;
  Buckets buckets;
  std::optional<WeightsInfo> weights;

  static Manifest read(const std::string& folder);
  const GraphEntry& graph(const std::string& name) const;  // throws manifest_error naming the re-export
};

}  // namespace seer
