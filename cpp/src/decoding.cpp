#include "decoding.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace seer {
namespace {

constexpr double NEG_INF = -std::numeric_limits<double>::infinity();

// a before b in numpy's stable argsort of -confidence: the higher first, NaN last, ties to the earlier position
bool ranks_before(const std::vector<double>& conf, int64_t a, int64_t b) {
  const double ca = conf[a], cb = conf[b];
  if (std::isnan(ca) || std::isnan(cb)) return std::isnan(ca) ? std::isnan(cb) && a < b : true;
  return ca > cb || (ca == cb && a < b);
}

}  // namespace

Decoding choose(const GenerationConfig& gen, const Manifest& manifest) {
  const std::string score = score_output(gen.remasking);
  if (gen.remasking != "low_confidence" && !(!score.empty() && manifest.graph("denoise").output(score)))
    throw input_error("remasking '" + gen.remasking + "': the C++ runtime ranks positions by the prediction's "
                      "log-probability (low_confidence, Dream's maskgit_plus) or by a Dream score its denoise graph "
                      "returns (topk_margin, entropy: an export of a Dream family); pass remasking low_confidence, or "
                      "run " + gen.remasking + " with seer-run");
  const DecodingRule rule = gen.rule();
  if (!score.empty() && !rule.fixed())
    throw input_error("remasking '" + gen.remasking + "' ranks positions by a score that is not a probability; it "
                      "runs with decoding 'fixed' (Dream's loop), not '" + gen.decoding + "'; pass remasking "
                      "'low_confidence' for a rule that commits by probability");
  return {rule, score};
}

std::vector<double> factor_bounds(int64_t width, double factor) {
  std::vector<double> out(width, NEG_INF);
  for (int64_t n = 2; n <= width; ++n) {
    const double bound = 1.0 - factor / (static_cast<double>(n) + 1.0);
    if (bound > 0) out[n - 1] = std::log(std::max(bound, 1e-300));
  }
  return out;
}

Committer::Committer(const DecodingRule& rule, int64_t width)
    : rule_(rule), log_tau_(rule.name == "threshold" ? std::log(rule.value) : 0.0),
      bounds_(rule.name == "factor" ? factor_bounds(width, rule.value) : std::vector<double>{}), order_(width) {}

void Committer::operator()(const std::vector<double>& conf, const std::vector<char>& eligible, int64_t transfer,
                           std::vector<char>& chosen) {
  const int64_t width = static_cast<int64_t>(conf.size());
  std::fill(chosen.begin(), chosen.end(), 0);
  auto before = [&](int64_t a, int64_t b) { return ranks_before(conf, a, b); };
  for (int64_t j = 0; j < width; ++j) order_[j] = j;
  if (rule_.name == "threshold") {
    int64_t top = 0;
    for (int64_t j = 1; j < width; ++j) top = before(j, top) ? j : top;
    for (int64_t j = 0; j < width; ++j) chosen[j] = eligible[j] && (conf[j] >= log_tau_ || j == top);
    return;
  }
  int64_t take = std::min(transfer, width);
  if (rule_.name == "factor") {
    std::sort(order_.begin(), order_.end(), before);
    int64_t run = 0;  // the run of passing positions from the top
    while (run < width && eligible[order_[run]] && conf[order_[run]] >= bounds_[run]) ++run;
    take = std::max<int64_t>(run, 1);
  } else if (take > 0) {
    std::partial_sort(order_.begin(), order_.begin() + take, order_.end(), before);
  }
  for (int64_t c = 0; c < take; ++c) chosen[order_[c]] = eligible[order_[c]];
}

}  // namespace seer
