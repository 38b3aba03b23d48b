// How a request decodes, chosen once per group of requests and then only used (seer_trt/runtime/decoding.py,
// docs/DESIGN.md "Decoding strategies").
//
// In:  the group's GenerationConfig and the export's Manifest.
// Out: a Decoding: the denoise output a step ranks positions by (the prediction's log-probability, or a Dream score
//      the graph returns) and the rule that commits (a DecodingRule). The loop (denoise.hpp) uses a Committer of
//      that rule; nothing else in the C++ runtime branches on a rule's or a remasking's name.
//
//     fixed        the row's transfer[t] most confident eligible positions (ties to the earlier position)
//     threshold:τ  every eligible position with log-probability >= log τ, and the row's most confident one
//     factor:f     the n most confident while the k-th (k <= n) has log-probability >= log(1 - f / (k + 1)), >= 1
//
// The C++ runtime decodes greedily (temperature 0); sampling runs in Python (seer_trt.runtime.decoding's Sampled
// and TopK).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace seer {

struct Decoding {
  DecodingRule rule;  // how many positions a step commits
  std::string score;  // the denoise output a step ranks by: "" the log-probability; Dream's log_margin (topk_margin)
                      // or neg_entropy (entropy)
  // whether a full-depth step-zero pass's greedy prediction is step 0 (it ranks by the log-probability, as this does)
  bool step_zero_predicts() const { return score.empty(); }
};

// The decoding of requests of `gen` on this export (seer_trt.runtime.decoding.choose); input_error for a remasking
// the C++ runtime cannot rank by, and for a Dream score with a rule that commits by probability.
Decoding choose(const GenerationConfig& gen, const Manifest& manifest);

// [width] the log-probability the n-th most confident position needs under factor:f, -inf for n = 1 and where
// 1 - f / (n + 1) <= 0 (seer_trt.runtime.decoding.factor_bounds)
std::vector<double> factor_bounds(int64_t width, double factor);

// The positions one row commits (seer_trt.runtime.decoding.Rule.commit) into chosen; conf is -inf where not
// eligible, and ranks run over the whole row as numpy's do. Scratch of the row's width is allocated once.
class Committer {
 public:
  Committer(const DecodingRule& rule, int64_t width);
  void operator()(const std::vector<double>& conf, const std::vector<char>& eligible, int64_t transfer,
                  std::vector<char>& chosen);

 private:
  DecodingRule rule_;
  double log_tau_;              // threshold: log τ
  std::vector<double> bounds_;  // factor: by rank
  std::vector<int64_t> order_;
};

}  // namespace seer
