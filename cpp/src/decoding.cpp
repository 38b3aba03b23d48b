#include "decoding.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace seer {
namespace {

constexpr double NEG_INF = -std::numeric_limits<double>::infinity();

// a before b in numpy's stable argsort of -confidence: the higher first, NaN last, ties to the earlier position
bool ranks_before(const double* conf, int64_t a, int64_t b) {
  const double ca = conf[a], cb = conf[b];
  if (std::isnan(ca) || std::isnan(cb)) return std::isnan(ca) ? std::isnan(cb) && a < b : true;
  return ca > cb || (ca == cb && a < b);
}

// One row's positions by rank, the first `count` of them in order (commit_top_k's argsort)
void rank(const double* conf, int64_t width, int64_t count, std::vector<int64_t>& order) {
  order.resize(width);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t a, int64_t b) { return ranks_before(conf, a, b); };
  if (count >= width) std::sort(order.begin(), order.end(), before);
  else if (count > 0) std::partial_sort(order.begin(), order.begin() + count, order.end(), before);
}

// The row's transfer[t] most confident eligible positions (LLaDA-V generate_with_embeds).
class Fixed : public Rule {
 public:
  explicit Fixed(const DecodingRule& rule) : Rule(rule) {}
  bool fixed() const override { return true; }
  void commit(const std::vector<int64_t>& members, const double* conf, const char* eligible, const int64_t* transfer,
              int64_t width, char* chosen) const override {
    std::vector<int64_t> order;
    for (int64_t i : members) {
      const int64_t take = std::min(transfer[i], width), at = i * width;
      rank(conf + at, width, take, order);
      for (int64_t c = 0; c < take; ++c) chosen[at + order[c]] = eligible[at + order[c]];
    }
  }
};

// Every eligible position with probability >= τ, and at least the most confident (Fast-dLLM).
class Threshold : public Rule {
 public:
  explicit Threshold(const DecodingRule& rule) : Rule(rule), log_tau_(std::log(rule.value)) {}
  void commit(const std::vector<int64_t>& members, const double* conf, const char* eligible, const int64_t*,
              int64_t width, char* chosen) const override {
    for (int64_t i : members) {
      const double* c = conf + i * width;
      int64_t top = 0;
      for (int64_t j = 1; j < width; ++j) top = ranks_before(c, j, top) ? j : top;
      for (int64_t j = 0; j < width; ++j)
        chosen[i * width + j] = eligible[i * width + j] && (c[j] >= log_tau_ || j == top);
    }
  }

 private:
  double log_tau_;
};

// The n most confident while the n-th has probability >= 1 - f / (n + 1), at least one (LLaDA-V's Fast-dLLM hook).
class Factor : public Rule {
 public:
  explicit Factor(const DecodingRule& rule) : Rule(rule) {}
  void commit(const std::vector<int64_t>& members, const double* conf, const char* eligible, const int64_t*,
              int64_t width, char* chosen) const override {
    const std::vector<double> bounds = factor_bounds(width, spelling.value);
    std::vector<int64_t> order;
    for (int64_t i : members) {
      const int64_t at = i * width;
      rank(conf + at, width, width, order);
      int64_t run = 0;  // the run of passing positions from the top
      while (run < width && eligible[at + order[run]] && conf[at + order[run]] >= bounds[run]) ++run;
      for (int64_t c = 0; c < std::max<int64_t>(run, 1); ++c) chosen[at + order[c]] = eligible[at + order[c]];
    }
  }
};

// count masks over `steps` steps, the remainder to the earliest (get_num_transfer_tokens)
void spread(int64_t count, int64_t steps, std::vector<int64_t>& out) {
  for (int64_t i = 0; i < steps; ++i) out.push_back(count / steps + (i < count % steps ? 1 : 0));
}

}  // namespace

std::shared_ptr<const Rule> Rule::of(const DecodingRule& rule) {
  if (rule.name == "threshold") return std::make_shared<Threshold>(rule);
  if (rule.name == "factor") return std::make_shared<Factor>(rule);
  return std::make_shared<Fixed>(rule);
}

Planned Spread::plan(int64_t length, int64_t, int64_t block_length, int64_t steps_per_block) const {
  Planned out;
  for (int64_t start = 0; start < length; start += block_length) {
    const int64_t size = std::min(block_length, length - start);
    const int64_t steps =
        size == block_length ? steps_per_block : (size * steps_per_block + block_length - 1) / block_length;
    spread(size, steps, out.transfer);
    out.block_end.insert(out.block_end.end(), steps, start + size);
  }
  return out;
}

std::vector<float> linspace32(float start, float end, int64_t count) {
  // torch.linspace in float32 as PyTorch's CPU kernel computes it (seer_trt.runtime.decoding.linspace32): a float32
  // step, start + step * i for the first half and end - step * (count - 1 - i) for the rest, each rounded once
  if (count == 1) return {start};
  const float step = (end - start) / static_cast<float>(count - 1);
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i)
    out[i] = static_cast<float>(i < count / 2 ? double(start) + double(step) * double(i)
                                              : double(end) - double(step) * double(count - 1 - i));
  return out;
}

std::vector<float> dream_fractions(int64_t steps) {
  const std::vector<float> t = linspace32(1.0f, DREAM_EPS, steps + 1);
  std::vector<float> out(steps);
  for (int64_t i = 0; i < steps; ++i)
    out[i] = i == steps - 1 ? std::numeric_limits<float>::infinity() : 1.0f - t[i + 1] / t[i];
  return out;
}

std::vector<int64_t> dream_transfer(int64_t masks, int64_t steps) {
  // Dream's diffusion_generate: int(masks left * (1 - t[i + 1] / t[i])) in float32, the last step all that are left
  std::vector<int64_t> out;
  int64_t left = masks;
  for (float f : dream_fractions(steps)) {
    const int64_t k = std::isinf(f) ? left : static_cast<int64_t>(static_cast<float>(left) * f);
    out.push_back(k);
    left -= k;
  }
  return out;
}

Planned Timesteps::plan(int64_t length, int64_t steps, int64_t, int64_t) const {
  return {dream_transfer(length, steps), std::vector<int64_t>(steps, length), dream_fractions(steps)};
}

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
  // GenerationConfig.schedule -> its counts (seer_trt.runtime.decoding.COUNTS; validate() admits these two)
  static const std::shared_ptr<const Counts> spread = std::make_shared<Spread>(),
                                             timesteps = std::make_shared<Timesteps>();
  Decoding out;
  out.rule = Rule::of(rule);
  out.score = score;
  out.counts = gen.schedule == "dream" ? timesteps : spread;
  return out;
}

std::vector<double> factor_bounds(int64_t width, double factor) {
  std::vector<double> out(width, NEG_INF);
  for (int64_t n = 2; n <= width; ++n) {
    const double bound = 1.0 - factor / (static_cast<double>(n) + 1.0);
    if (bound > 0) out[n - 1] = std::log(std::max(bound, 1e-300));
  }
  return out;
}

}  // namespace seer
