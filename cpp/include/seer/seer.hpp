// seer-trt's C++ runtime: the Seer pipeline of seer_trt (Python) over ONNX Runtime, on the same export folder
// (docs/DESIGN.md "C++ runtime").
//
// In:  an export folder written by seer-export (manifest.json, the ONNX graphs, weights.data, tokenizer/), and
//      requests: chat-formatted prompt ids (seer-prompt-ids prints them) and optional preprocessed pixel tiles.
// Out: per request the answer ids, the kept window L*, the denoising steps used and per-stage seconds; the
//      answer text where the export's tokenizer decoder is one this library reads (word-level, byte-level).
//
//     prompt ids, tiles ─► embed / vision graphs ─► step zero ─► boundary ─► truncation + step budget
//     ─► one denoising loop over every row (each step's calls split by the dispatch policy: static / packed / eager;
//        greedy or sampled with the request's temperature, top_p and seed; fixed, threshold or factor rule; the
//        prompt K/V cache) ─► answer ids
//
// ONNX Runtime is loaded with dlopen at run time (Options::ort_library), so a service picks its ORT build
// (CPU, CUDA, TensorRT EP) without relinking. A Pipeline may be used from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace seer {

// Every error a caller can trigger; what() names the value found, the value expected and the fix.
class Error : public std::runtime_error {
 public:
  enum class Kind { Config, Input, Manifest, Runtime };
  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct Options {
  std::string ort_library;       // path of libonnxruntime.so; "" = $SEER_ORT_LIBRARY, else the build's SDK, else
                                 // "libonnxruntime.so" on the loader's search path
  std::string provider = "cpu";  // "cpu" | "cuda" | "tensorrt" (the library must have been built with it)
  int device_id = 0;             // GPU of the cuda / tensorrt provider
  int threads = 0;               // intra-op threads per session, 0 = ONNX Runtime's default
  std::string policy = "cost_model";  // dispatch: cost_model | hybrid | naive_pad | static | packed | per_request
  double tau_pad = 0.2;          // hybrid: padding share above which a group is packed
  int short_rows = 4;            // hybrid: rows with L* <= this are grouped apart (0: no such groups)
  bool share_weights = true;     // CPU: every session reads one memory map of weights.data
  // the prompt K/V cache of requests that do not choose one (manifest schema 2.1 exports; docs/DESIGN.md "Prompt K/V cache"); the
  // default is seer_trt.contracts.policies.DEFAULT_CACHE's, reuse every 8 steps (a 2.0 export needs cache "none"):
  std::string cache = "reuse";   // none (every step computes the prompt: the exact loop) | reuse | forecast
  int64_t refresh_interval = 8;  // reuse / forecast: steps between prompt computations (and one at each block)
  int64_t forecast_order = 1;    // forecast: Lagrange order, 1 or 2
  // bytes the prompt K/V pool may hold (the rows' snapshots and the loop's call buffers): a request joins the loop
  // when its slot fits; -1: a quarter of the machine's memory (seer_trt.runtime.kv_cache.default_kv_budget)
  int64_t kv_budget = -1;
};

// The decoding rules a request or an export may name: how many positions a denoising step commits.
constexpr const char* DECODING_FORMS =
    "'fixed', 'threshold:TAU' (0 < TAU <= 1, e.g. threshold:0.9) or 'factor:F' (F > 0, e.g. factor:1)";

// The one spelling of a decoding rule ("factor:1.0" -> "factor:1", " fixed " -> "fixed"), by which requests group;
// throws Error naming DECODING_FORMS (Python's message word for word) for a rule that is none of them.
std::string canonical_decoding(const std::string& rule);

// One question. Unset overrides take the export's generation defaults.
struct Request {
  std::vector<int64_t> prompt_ids;   // chat-formatted prompt ids; -200 (IMAGE_PLACEHOLDER) where the image goes
  std::vector<float> pixel_values;   // [tiles, 3, S, S] float32 tiles of the image, normalised; empty: no image
  int64_t tiles = 0;                 // tiles in pixel_values ("pad" exports: 1; anyres: 1 + cols * rows)
  int64_t grid_cols = 0, grid_rows = 0;          // anyres exports: the tile grid (seer-prompt-ids writes it)
  int64_t image_width = 0, image_height = 0;     // anyres exports: the image's size in pixels before tiling
  std::optional<int64_t> gen_length; // answer window N
  std::optional<int64_t> steps;      // denoising steps over N (Seer rescales them to the kept window)
  std::optional<int64_t> block_length;
  std::optional<std::string> decoding;  // commit rule, one of DECODING_FORMS; unset: the export's (docs/DESIGN.md
                                        // "Decoding strategies")
  // what ranks the positions: "low_confidence" (the prediction's log-probability; Dream's maskgit_plus), or Dream's
  // "topk_margin" / "entropy" as a Dream export's denoise graph returns them; unset: the export's
  std::optional<std::string> remasking;
  std::optional<int64_t> window;     // cut the window to this length without step zero (the oracle)
  bool seer = true;                  // false: the padded baseline, every step over all N positions
  bool early_stop = false;           // LLaDA-V's stopping_criteria=['<|eot_id|>']
  std::optional<std::string> cache;  // "none" | "reuse" | "forecast"; unset: Options::cache
  std::optional<int64_t> refresh_interval;  // unset: Options::refresh_interval
  // 0: greedy; (0, 2]: Gumbel sampling over denoise_logits where exported, else denoise's top ids (docs/DESIGN.md
  // "Decoding strategies"); unset: the export's
  std::optional<double> temperature;
  uint64_t seed = 0;                 // sampling noise (temperature > 0, random remasking), in [0, 2**63)
  double top_p = 1.0;                // nucleus sampling: draw from the smallest set of ids holding this mass, (0, 1]
  std::vector<std::string> stop;     // the answer text ends before the first of these (at most 4, none empty)
};

// The answer text cut before the stop sequence that ends first in it, the longest of those ending at the same
// character (seer_trt.serving.stops.cut_at_stop, on UTF-8 bytes: a match of valid UTF-8 starts on a character).
std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stop);

// Seconds per stage; batched stages count the whole batch's time, as seer_trt's Result.seconds does.
struct Timings {
  double preprocess = 0, step_zero = 0, boundary = 0, dispatch = 0, packing = 0, denoise = 0, detokenize = 0;
  double graphs = 0;  // of the above, the time inside ONNX Runtime's Run (this request's and its batch's calls)
};

struct Result {
  std::vector<int64_t> token_ids;  // answer ids before the first <|eot_id|>
  std::vector<int64_t> window;     // every kept position's id
  int64_t kept = 0;                // L*: answer positions denoised (N without Seer)
  int64_t steps = 0;               // denoising steps this row took part in
  int64_t gen_length = 0;          // N
  Timings seconds;
  std::optional<std::string> text; // the answer, special tokens dropped, cut at a stop sequence; none when the
                                   // decoder is not readable
  std::string error;               // why this request failed ("" when it did not); the fields above are empty then
  int64_t refreshes = 0;           // denoising steps that computed the prompt (every graph call under cache none)
  bool ok() const { return error.empty(); }
};

class Pipeline {
 public:
  // Opens every graph the runtime uses (embed, vision, step_zero where calibrated, denoise).
  // Throws Error: no manifest or another schema major version, a missing or corrupt graph or weights file,
  // an ONNX Runtime library that cannot be loaded, a provider it lacks.
  static std::unique_ptr<Pipeline> open(const std::string& folder, const Options& options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One Result per request, in order; a bad request fails alone (Result::error). policy: "" = Options::policy.
  std::vector<Result> generate(const std::vector<Request>& requests, const std::string& policy = "");

  int64_t image_size() const;      // S of the tiles the vision graph takes
  int64_t max_tiles() const;       // tiles one image may have: 1 ("pad"), anyres 1 + the largest pinpoint grid
  int64_t max_prompt_ids() const;  // prompt ids one request may hold: the largest prompt bucket
  int64_t vocab_size() const;
  std::string ort_version() const; // of the loaded library

 private:
  struct Impl;
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

constexpr int64_t IMAGE_PLACEHOLDER = -200;  // LLaDA-V's IMAGE_TOKEN_INDEX: the image's features go here

}  // namespace seer
