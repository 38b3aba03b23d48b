// manifest.json of an export folder (seer_trt/contracts/manifest.py, docs/DESIGN.md "Graphs and their contract"): what the runtime needs of it.
//
// In:  the folder's manifest.json (schema 2.x; another major version is refused with the fix).
// Out: Manifest: model dims, vision settings, special ids, Seer calibration, generation defaults (the decoding rule
//      included: "fixed" before schema 2.2), graphs with their inputs and outputs, length buckets, the shared weights
//      file; and the window graph's confidence output (log_confidence, or a 2.1 export's confidence and its log).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "seer/seer.hpp"

namespace seer {

inline Error config_error(const std::string& m) { return Error(Error::Kind::Config, m); }
inline Error input_error(const std::string& m) { return Error(Error::Kind::Input, m); }
inline Error manifest_error(const std::string& m) { return Error(Error::Kind::Manifest, m); }

// An export reads only regular files inside its own folder (Python: seer_trt/contracts/confined.py).
constexpr std::uintmax_t MAX_MANIFEST_BYTES = 16ull << 20;
constexpr std::uintmax_t MAX_INDEX_BYTES = 64ull << 20;
constexpr std::uintmax_t MAX_TOKENIZER_BYTES = 256ull << 20;

// The path of `name`, which the manifest's `entry` names, inside the export `folder`: a non-empty relative path
// without "..", resolving (symbolic links followed) inside the folder; with `regular`, an existing regular file of
// at most `limit` bytes (0: any). Throws manifest_error naming the export and the entry.
std::string export_path(const std::string& folder, const std::string& name, const std::string& entry,
                        bool regular = false, std::uintmax_t limit = 0);
// The bytes of `path`, a regular file of at most `limit` bytes, opened without blocking (a FIFO is refused).
std::string read_bounded(const std::string& path, const std::string& folder, const std::string& entry,
                         std::uintmax_t limit);

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
  // Seer's end tail (schema 2.5; docs/DESIGN.md "Seer, exactly"): the share of the cut-away positions kept after the
  // window as committed end tokens, and which token ("eot" | "endoftext")
  double tail = 0;
  std::string tail_token = "eot";
  bool full_depth() const { return signal == "end_token_prob"; }
};

// A decoding rule (seer_trt.contracts.config.parse_decoding, docs/DESIGN.md "Decoding strategies"): how many
// positions a denoising step commits.
struct DecodingRule {
  std::string name = "fixed";  // fixed (the schedule's count) | threshold (probability >= tau) | factor
  double value = 0;            // tau of threshold (0 < tau <= 1), f of factor (f > 0); 0 for fixed
  bool fixed() const { return name == "fixed"; }
};

// "fixed", "threshold:TAU" or "factor:F" as a rule; config_error with seer::DECODING_FORMS for anything else, the
// message word for word Python's. canonical_decoding (seer/seer.hpp) writes a rule as Python's "{name}:{value:g}";
// the rule a group runs is that spelling parsed again, as in Python.
DecodingRule parse_decoding(const std::string& text);
// Python's repr() of a str: the decoding error messages quote the value as Python does.
std::string python_repr(const std::string& text);

struct GenerationConfig {
  int64_t gen_length = 128, steps = 128, block_length = 128;
  double temperature = 0.0;
  std::string remasking = "low_confidence";
  std::string decoding = "fixed";  // canonical_decoding's spelling
  std::string schedule = "even";   // "even" (LLaDA's spread per block) | "dream" (diffusion_generate's timesteps)
  int64_t num_blocks() const { return gen_length / block_length; }
  DecodingRule rule() const { return parse_decoding(decoding); }
  void validate() const;  // seer_trt.contracts.config.GenerationConfig.__post_init__; throws config_error
  bool operator<(const GenerationConfig& o) const;
  bool operator==(const GenerationConfig& o) const;
};

// How a request's gen_length N reshapes the window (manifest "lengths", schema 2.6; seer_trt.contracts.config.WindowRule):
// "whole" (one block of N), "cap" (blocks of min(size, N)) or "split" (count blocks of N / count); the steps keep the
// defaults' steps per token, at least one. A manifest before 2.6 reads the rule model.loop_blocks and the defaults imply.
struct WindowRule {
  std::string blocks = "whole";
  int64_t size = 0, count = 0;  // cap's largest block, split's number of blocks; 0 where the rule takes none
  // {block_length, steps} of a window of n positions (block: the request's own block length, which the rule then does
  // not choose); config_error for a split count that does not divide n
  std::pair<int64_t, int64_t> shape(int64_t n, const GenerationConfig& base, std::optional<int64_t> block = {}) const;
};

// What the cost_model policy's calibration times (manifest "cost_calibration", schema 2.6;
// seer_trt.contracts.config.CostCalibration): (rows, prompt, answer) shapes, each clipped to the buckets, and timed
// steps per shape after one warm-up.
// Bounded when read (docs/DESIGN.md "Bounds and output folders"): at most MAX_SHAPES shapes within the buckets'
// ceilings, at most MAX_REPEATS repeats (Python: MAX_CALIBRATION_SHAPES, MAX_CALIBRATION_REPEATS).
struct CostCalibration {
  static constexpr size_t MAX_SHAPES = 32;
  static constexpr int64_t MAX_REPEATS = 20;
  std::vector<std::array<int64_t, 3>> shapes;
  int64_t repeats = 5;
};

// The window graph's output the loop ranks, and whether it is already a log-probability: "log_confidence" (schema
// 2.2), else a 2.1 export's "confidence", whose log the runtime takes (seer_trt.contracts.graphs.log_confidence).
struct ConfidenceOutput {
  std::string name;
  bool is_log = true;
};
ConfidenceOutput confidence_output(const GraphEntry& window);  // manifest_error when the graph has neither
// The denoise output of Dream's score `remasking` ranks by: log_margin (topk_margin), neg_entropy (entropy)
// (seer_trt.contracts.graphs.SCORE_OUTPUTS)
inline std::string score_output(const std::string& remasking) {
  return remasking == "topk_margin" ? "log_margin" : remasking == "entropy" ? "neg_entropy" : "";
}

// The natural log of float32 probabilities in place, bit for bit numpy's np.log on a float32 array (log(0) = -inf):
// on x86-64 with AVX2 and FMA (or AVX-512) numpy's own vectorised log, which differs from libm's logf in the last
// bit on about 9% of inputs; elsewhere libm's logf, which numpy calls there.
void log_in_place(float* values, size_t count);

struct SpecialTokens {
  int64_t mask_id, endoftext_id, startoftext_id, eot_id, start_header_id, end_header_id;
};

struct Buckets {
  std::vector<int64_t> batch, prompt, answer;
};

struct VisionInfo {
  int64_t image_size = 0, patch_size = 0, tokens_per_tile = 0;
  std::string image_aspect_ratio, newline;
  // "siglip": the vision graph's features; "magvitv2": the image_tokens graph's ids, embedded by embed (MMaDA)
  std::string encoder = "siglip";
  std::vector<std::pair<int64_t, int64_t>> grid_pinpoints;  // anyres candidate (width, height) px resolutions
  std::optional<int64_t> anyres_max_tiles;  // N of anyres_max_N: shrinks the feature map, not the tiles
  bool anyres() const { return image_aspect_ratio.rfind("anyres", 0) == 0; }
  bool image_ids() const { return encoder == "magvitv2"; }
  bool text_only() const { return encoder == "none"; }  // Dream: no image graph
  const char* graph() const { return image_ids() ? "image_tokens" : "vision"; }  // the image's graph
  // Tiles one image may have (seer_trt.contracts.profiles.tiles_per_image): 1 for "pad"; anyres: the base tile plus
  // the largest pinpoint grid, 1 + max (w / S) * (h / S). anyres_max_N caps no tiles (geometry.anyres_layout).
  int64_t max_tiles() const;
};

struct WeightsInfo {
  std::string file, index;
  int64_t size_bytes = 0;
};

struct Manifest {
  std::string schema_version;
  int64_t hidden_size = 0, vocab_size = 0, num_layers = 0;
  // model.logit_shift (schema 2.4): 1 when position i is predicted from hidden state i - 1 (Dream; in the graphs);
  // a cached step then computes each row's last prompt position (kv_cache.hpp)
  int64_t logit_shift = 0;
  VisionInfo vision;
  SpecialTokens special{};
  std::string tokenizer;  // folder, relative to the manifest
  SeerConfig seer;
  GenerationConfig generation;
  std::string precision;  // float32 | float16
  std::map<std::string, GraphEntry> graphs;
  Buckets buckets;
  std::optional<WeightsInfo> weights;
  WindowRule lengths;                 // how a request's gen_length shapes the window
  CostCalibration cost_calibration;  // what the cost_model policy times

  static Manifest read(const std::string& folder);
  const GraphEntry& graph(const std::string& name) const;  // throws manifest_error naming the re-export
};

}  // namespace seer
