// How a request decodes, chosen once per group of requests and then only used (seer_trt/runtime/decoding.py,
// docs/DESIGN.md "Decoding strategies").
//
// In:  the group's GenerationConfig and the export's Manifest.
// Out: a Decoding: the window graph its steps call, the denoise output a step ranks positions by (the prediction's
//      log-probability, or a Dream score the graph returns), the Rule that commits (Fixed, Threshold, Factor) and how
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
// The C++ runtime decodes greedily (temperature 0); sampling runs in Python (seer_trt.runtime.decoding's Sampled
// and TopK).
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

struct Decoding {
  std::string graph = "denoise";      // the window graph its steps call (greedy: denoise)
  std::shared_ptr<const Rule> rule;   // how many positions a step commits
  std::string score;  // the denoise output a step ranks by: "" the log-probability; Dream's log_margin (topk_margin)
                      // or neg_entropy (entropy)
  std::shared_ptr<const Counts> counts;  // how the fixed rule's commits are laid out over the steps
  // whether a full-depth step-zero pass's greedy prediction is step 0 (it ranks by the log-probability, as this does)
  bool step_zero_predicts() const { return score.empty(); }
};

// The decoding of requests of `gen` on this export (seer_trt.runtime.decoding.choose); input_error for a remasking
// the C++ runtime cannot rank by, and for a Dream score with a rule that commits by probability.
Decoding choose(const GenerationConfig& gen, const Manifest& manifest);

// [width] the log-probability the n-th most confident position needs under factor:f, -inf for n = 1 and where
// 1 - f / (n + 1) <= 0 (seer_trt.runtime.decoding.factor_bounds)
std::vector<double> factor_bounds(int64_t width, double factor);

}  // namespace seer
