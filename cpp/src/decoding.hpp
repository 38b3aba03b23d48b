// How a request decodes, chosen once per group of requests and then only used (seer_trt/runtime/decoding.py,
// docs/DESIGN.md "Decoding strategies").
//
// In:  the group's GenerationConfig and the export's Manifest.
// Out: a Decoding: the window graph its steps call, the Predictor that predicts and ranks a step's positions (Greedy:
//      the graph's argmax by its log-probability or a Dream score it returns; Sampled: Gumbel over denoise_logits;
//      TopK: Gumbel over denoise's top ids), the Rule that commits (Fixed, Threshold, Factor) and how
//      a fixed rule's commits are laid out over the steps (Counts: LLaDA's Spread per block, Dream's Timesteps). Each
//      is an object chosen once; the loop (denoise.hpp) and the schedule (schedule.hpp) only call them, and nothing
//      else in the C++ runtime parses a rule's spelling or branches on a rule's, a remasking's or a schedule's name.
//
//     fixed        the row's transfer[t] most confident eligible positions (ties to the earlier position)
//     threshold:τ  every eligible position with log-probability >= log τ, and the row's most confident one
//     factor:f     the n most confident while the k-th (k <= n) has log-probability >= log(1 - f / (k + 1)), >= 1
//
//     counts   Spread      LLaDA-V's get_num_transfer_tokens: a block's masks spread evenly over its steps
//              Timesteps   Dream's diffusion_generate: int(m (1 - t[i+1] / t[i])) of the m masks still open
//
// Sampled draws come from a counter-based generator (uniform) of the row's seed, its own step and the position, bit
// for bit seer_trt.runtime.decoding.uniform, so a row's samples are the same whatever shares its call. The float64
// arithmetic around them is numpy's, one operation at a time (its pairwise sums, stable sorts, first-maximum
// argmax); exp, log and pow are libm's, which differ from numpy's vectorised ones in the last bit on a few percent
// of inputs (docs/DESIGN.md "C++ runtime": what that changes, measured).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace seer {

// A commit rule, parsed once from its spelling (Rule::of): Fixed, Threshold or Factor. Its commit never looks at its
// name again.
class Rule {
 public:
  virtual ~Rule() = default;
  static std::shared_ptr<const Rule> of(const DecodingRule& rule);
  // Whether the step count and blocks come from the schedule (else a row commits as confidence allows and moves to
  // its next block once the current one is full)
  virtual bool fixed() const { return false; }
  // The positions a step commits for the rows `members` of [rows, width] arrays: conf is -inf where not eligible
  // (ranks run over the whole row, as numpy's do), transfer [rows] the fixed schedule's count; chosen is written.
  virtual void commit(const std::vector<int64_t>& members, const double* conf, const char* eligible,
                      const int64_t* transfer, int64_t width, char* chosen) const = 0;
  bool operator==(const Rule& o) const {
    return spelling.name == o.spelling.name && spelling.value == o.spelling.value;
  }
  const DecodingRule spelling;  // what it was parsed from: the rows of equal rules commit together

 protected:
  explicit Rule(const DecodingRule& rule) : spelling(rule) {}
};

// The tokens a row commits at each of its steps under the fixed rule, and the block each step works in.
struct Planned {
  std::vector<int64_t> transfer;   // [steps] tokens per step
  std::vector<int64_t> block_end;  // [steps] the block end of each step
  std::vector<float> fraction;     // [steps] Dream's 1 - t[i + 1] / t[i] (inf at the last step); empty for Spread
};

class Counts {
 public:
  virtual ~Counts() = default;
  // the plan of a row keeping `length` positions over `steps` steps
  virtual Planned plan(int64_t length, int64_t steps, int64_t block_length, int64_t steps_per_block) const = 0;
};

// LLaDA-V's generate_with_embeds: steps_per_block steps per block; a block's masks spread evenly over its steps, the
// remainder to the earliest; a final partial block (after Seer's cut) gets its share, rounded up.
class Spread : public Counts {
 public:
  Planned plan(int64_t length, int64_t steps, int64_t block_length, int64_t steps_per_block) const override;
};

constexpr float DREAM_EPS = 1e-3f;  // DreamGenerationConfig's eps

// Dream's diffusion_generate: one block; step i commits int(m (1 - t[i + 1] / t[i])) of the m masks still open (the
// loop reads the fractions), t = linspace(1, eps, steps + 1) in float32, the last step all that are left.
class Timesteps : public Counts {
 public:
  Planned plan(int64_t length, int64_t steps, int64_t block_length, int64_t steps_per_block) const override;
};

std::vector<float> linspace32(float start, float end, int64_t count);  // torch.linspace(start, end, count), float32
std::vector<float> dream_fractions(int64_t steps);                     // 1 - t[i + 1] / t[i] per step, inf at the last
std::vector<int64_t> dream_transfer(int64_t masks, int64_t steps);     // Dream's count per step

// A float64 uniform in (0, 1) of (row seed, step, answer position, column): splitmix64's finaliser over the mixed
// counters in uint64 (seer_trt.runtime.decoding.uniform, bit for bit)
double uniform(uint64_t seed, uint64_t step, uint64_t position, uint64_t column);

// numpy's sum of a contiguous float64 row (its pairwise summation: blocks of 8 partial sums up to 128, halves above)
double pairwise_sum(const double* values, int64_t count);

// One graph call's outputs a step reads, each [b, g(, width)] over the call's cells (Loop::run fills it).
struct CallOutputs {
  struct Output {
    const float* f = nullptr;    // float32 outputs
    const int64_t* i = nullptr;  // int64 outputs
    int64_t width = 1;           // last axis (1 for [b, g])
  };
  std::vector<std::pair<std::string, Output>> outputs;
  const float* log_confidence = nullptr;  // the prediction's log-probability (a 2.1 export's confidence, logged)
  const Output& operator[](const std::string& name) const;
};

// What a row draws with at one step (seer_trt.runtime.denoise.RowSettings' seed and top_p, the row's own step).
struct Draw {
  uint64_t seed = 0;
  int64_t step = 0;      // the row's own step t (its draws use 2t, its random remasking 2t + 1)
  double top_p = 1.0;    // nucleus mass
  bool nucleus = false;  // whether the call draws within nuclei: temperature > 0 and a row of the call has top_p < 1
};

// A step's prediction and ranking of one row's positions (seer_trt.runtime.decoding's Greedy, Sampled, TopK).
class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual const char* graph() const = 0;  // the window graph it reads
  // the outputs of that graph it fetches (of those the graph has)
  virtual std::vector<std::string> reads(const GraphEntry& graph, const std::string& confidence) const = 0;
  // x0 and the confidence of the row's `count` positions at the call's `cells`
  virtual void predict(const CallOutputs& out, const int64_t* cells, int64_t count, const Draw& draw, int64_t* x0,
                       double* confidence) const = 0;
  virtual bool samples() const { return false; }  // whether it reads seeds (sampled tokens or random remasking)
};

struct Decoding {
  std::shared_ptr<const Predictor> predictor;  // what predicts and ranks a step's positions, and the graph it calls
  std::shared_ptr<const Rule> rule;            // how many positions a step commits
  std::string score;  // what a greedy step ranks by: "" the log-probability; Dream's log_margin (topk_margin)
                      // or neg_entropy (entropy)
  std::shared_ptr<const Counts> counts;  // how the fixed rule's commits are laid out over the steps
  double temperature = 0;                // 0: argmax
  std::string graph() const { return predictor->graph(); }
  // whether a full-depth step-zero pass's greedy prediction is step 0 (greedy, by the log-probability, as it ranks)
  bool step_zero_predicts() const { return !predictor->samples() && score.empty(); }
};

// The decoding of requests of `gen` on this export (seer_trt.runtime.decoding.choose): greedy through denoise;
// sampling or random remasking over denoise_logits where exported, else over denoise's top ids (TopK) where it returns
// them. input_error for a remasking the C++ runtime cannot rank by, for a Dream score with a rule that commits by
// probability or at a temperature, and for sampling on an export with neither graph.
Decoding choose(const GenerationConfig& gen, const Manifest& manifest);

// [width] the log-probability the n-th most confident position needs under factor:f, -inf for n = 1 and where
// 1 - f / (n + 1) <= 0 (seer_trt.runtime.decoding.factor_bounds)
std::vector<double> factor_bounds(int64_t width, double factor);

}  // namespace seer
