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

constexpr uint64_t M1 = 0x9E3779B97F4A7C15ull, M2 = 0xBF58476D1CE4E5B9ull, M3 = 0x94D049BB133111EBull;

// index of the first maximum, as np.argmax (a NaN wins at its first place, as numpy's does)
int64_t argmax(const double* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n && !std::isnan(v[best]); ++i)
    if (v[i] > v[best] || std::isnan(v[i])) best = i;
  return best;
}

// x ** temperature as numpy's power with a scalar exponent: its fast paths (1: x, 0.5: sqrt, 2: square), else pow
double power(double x, double temperature) {
  if (temperature == 1.0) return x;
  if (temperature == 0.5) return std::sqrt(x);
  if (temperature == 2.0) return x * x;
  return std::pow(x, temperature);
}

// The nucleus of one position (seer_trt.runtime.decoding.nucleus) into keep [V]: the most probable ids under
// softmax(scaled) whose mass before them is below top_p (the most probable always; ties to the lower id), in numpy's
// order of operations: p = exp(scaled - max) / pairwise sum, a stable sort by -p, before = cumsum - ranked.
void nucleus(const double* scaled, int64_t v, double top_p, std::vector<double>& p, std::vector<int64_t>& order,
             std::vector<char>& keep) {
  const double top = *std::max_element(scaled, scaled + v);
  p.resize(v);
  for (int64_t i = 0; i < v; ++i) p[i] = std::exp(scaled[i] - top);
  const double total = pairwise_sum(p.data(), v);
  for (int64_t i = 0; i < v; ++i) p[i] /= total;
  order.resize(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return -p[a] < -p[b]; });
  keep.assign(v, 0);
  double cumsum = 0;
  for (int64_t k = 0; k < v; ++k) {
    const double ranked = p[order[k]];
    cumsum = k == 0 ? ranked : cumsum + ranked;
    keep[order[k]] = cumsum - ranked < top_p;
  }
}

// Gumbel-max over one position's `v` candidates (shifted: their logits less the largest, float64): argmax of
// exp(shifted) (0 outside the nucleus) / (-log u) ** temperature, u one draw per candidate at (seed, 2t, position).
int64_t gumbel_max(const double* shifted, int64_t v, double temperature, const Draw& draw, int64_t position) {
  thread_local std::vector<double> drawn, scaled, p;
  thread_local std::vector<int64_t> order;
  thread_local std::vector<char> keep;
  drawn.resize(v);
  for (int64_t i = 0; i < v; ++i) drawn[i] = std::exp(shifted[i]);
  if (temperature > 0 && draw.nucleus) {
    scaled.resize(v);
    for (int64_t i = 0; i < v; ++i) scaled[i] = shifted[i] / temperature;
    nucleus(scaled.data(), v, draw.top_p, p, order, keep);
    for (int64_t i = 0; i < v; ++i) drawn[i] *= keep[i] ? 1.0 : 0.0;
  }
  const uint64_t step = 2 * static_cast<uint64_t>(draw.step);
  for (int64_t i = 0; i < v; ++i)
    drawn[i] /= power(-std::log(uniform(draw.seed, step, position, i)), temperature);
  return argmax(drawn.data(), v);
}

// random remasking's rank of a position: the log of one draw at (seed, 2t + 1, position)
double random_rank(const Draw& draw, int64_t position) {
  return std::log(uniform(draw.seed, 2 * static_cast<uint64_t>(draw.step) + 1, position, 0));
}

// Temperature 0: the denoise graph's own argmax, ranked by its log-probability or by a Dream score it returns.
class Greedy : public Predictor {
 public:
  explicit Greedy(std::string score) : score_(std::move(score)) {}
  const char* graph() const override { return "denoise"; }
  std::vector<std::string> reads(const GraphEntry&, const std::string& confidence) const override {
    return {"x0", score_.empty() ? confidence : score_};
  }
  void predict(const CallOutputs& out, const int64_t* cells, int64_t count, const Draw&, int64_t* x0,
               double* confidence) const override {
    const int64_t* ids = out["x0"].i;
    const float* conf = score_.empty() ? out.log_confidence : out[score_].f;
    for (int64_t j = 0; j < count; ++j) x0[j] = ids[cells[j]], confidence[j] = static_cast<double>(conf[cells[j]]);
  }

 private:
  std::string score_;
};

// Gumbel-max over denoise_logits in float64 (LLaDA's add_gumbel_noise; argmax at temperature 0), within the row's
// nucleus; ranked by the prediction's log-probability under the full softmax, or a uniform draw (random remasking).
class Sampled : public Predictor {
 public:
  Sampled(double temperature, bool random) : temperature_(temperature), random_(random) {}
  const char* graph() const override { return "denoise_logits"; }
  bool samples() const override { return true; }
  std::vector<std::string> reads(const GraphEntry&, const std::string&) const override { return {"logits"}; }
  void predict(const CallOutputs& out, const int64_t* cells, int64_t count, const Draw& draw, int64_t* x0,
               double* confidence) const override {
    const CallOutputs::Output& logits = out["logits"];
    const int64_t v = logits.width;
    std::vector<double> shifted(v), e(v);
    for (int64_t j = 0; j < count; ++j) {
      const float* l = logits.f + cells[j] * v;
      double top = static_cast<double>(l[0]);
      for (int64_t i = 1; i < v; ++i) top = std::max(top, static_cast<double>(l[i]));
      for (int64_t i = 0; i < v; ++i) shifted[i] = static_cast<double>(l[i]) - top;
      x0[j] = temperature_ > 0 ? gumbel_max(shifted.data(), v, temperature_, draw, j) : argmax(shifted.data(), v);
      if (random_) {
        confidence[j] = random_rank(draw, j);
      } else {  // log softmax of x0, float64
        for (int64_t i = 0; i < v; ++i) e[i] = std::exp(shifted[i]);
        confidence[j] = shifted[x0[j]] - std::log(pairwise_sum(e.data(), v));
      }
    }
  }

 private:
  double temperature_;
  bool random_;
};

// Gumbel-max over denoise's top_logits / top_ids (an export without denoise_logits), within the row's nucleus of them;
// ranked by the full softmax's log-probability of the drawn id (the graph's of its argmax plus the drawn id's shifted
// logit), or a uniform draw (random remasking).
class TopK : public Predictor {
 public:
  TopK(double temperature, bool random) : temperature_(temperature), random_(random) {}
  const char* graph() const override { return "denoise"; }
  bool samples() const override { return true; }
  std::vector<std::string> reads(const GraphEntry&, const std::string& confidence) const override {
    return {"top_logits", "top_ids", confidence};
  }
  void predict(const CallOutputs& out, const int64_t* cells, int64_t count, const Draw& draw, int64_t* x0,
               double* confidence) const override {
    const CallOutputs::Output &logits = out["top_logits"], &ids = out["top_ids"];
    const int64_t k = logits.width;
    std::vector<double> shifted(k);
    for (int64_t j = 0; j < count; ++j) {
      const float* l = logits.f + cells[j] * k;
      for (int64_t i = 0; i < k; ++i) shifted[i] = static_cast<double>(l[i]) - static_cast<double>(l[0]);
      const int64_t pick = gumbel_max(shifted.data(), k, temperature_, draw, j);
      x0[j] = ids.i[cells[j] * k + pick];
      confidence[j] = random_ ? random_rank(draw, j)
                              : static_cast<double>(out.log_confidence[cells[j]]) + shifted[pick];
    }
  }

 private:
  double temperature_;
  bool random_;
};

}  // namespace

double uniform(uint64_t seed, uint64_t step, uint64_t position, uint64_t column) {
  uint64_t z = seed * M1 + step * M2 + position * M3 + column;  // wraps, as numpy's uint64 does
  z ^= z >> 30;
  z *= M2;
  z ^= z >> 27;
  z *= M3;
  z ^= z >> 31;
  return (static_cast<double>(z >> 11) + 0.5) * 0x1p-53;
}

double pairwise_sum(const double* a, int64_t n) {
  // numpy's pairwise_sum_DOUBLE (numpy/_core/src/umath/loops_utils.h.src), PW_BLOCKSIZE 128
  if (n < 8) {
    double res = 0.;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

const CallOutputs::Output& CallOutputs::operator[](const std::string& name) const {
  for (const auto& [n, o] : outputs)
    if (n == name) return o;
  throw Error(Error::Kind::Runtime, "the window graph's output '" + name + "' was not fetched");
}

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
  const GraphEntry& denoise = manifest.graph("denoise");
  const bool ranks = gen.remasking == "low_confidence" || gen.remasking == "random";
  if (!ranks && !(!score.empty() && denoise.output(score)))
    throw input_error("remasking '" + gen.remasking + "': the C++ runtime ranks positions by the prediction's "
                      "log-probability (low_confidence, Dream's maskgit_plus), by a uniform draw (random) or by a "
                      "Dream score its denoise graph returns (topk_margin, entropy: an export of a Dream family); pass "
                      "remasking low_confidence, or run " + gen.remasking + " with seer-run");
  const DecodingRule rule = gen.rule();
  if (!score.empty() && !rule.fixed())
    throw input_error("remasking '" + gen.remasking + "' ranks positions by a score that is not a probability; it "
                      "runs with decoding 'fixed' (Dream's loop), not '" + gen.decoding + "'; pass remasking "
                      "'low_confidence' for a rule that commits by probability");
  if (!score.empty() && gen.temperature > 0)
    throw input_error("remasking '" + gen.remasking + "' at temperature " + std::to_string(gen.temperature) +
                      ": the C++ runtime ranks by a Dream score greedily only; pass temperature 0, or run it with "
                      "seer-run");
  // GenerationConfig.schedule -> its counts (seer_trt.runtime.decoding.COUNTS; validate() admits these two)
  static const std::shared_ptr<const Counts> spread = std::make_shared<Spread>(),
                                             timesteps = std::make_shared<Timesteps>();
  Decoding out;
  out.rule = Rule::of(rule);
  out.score = score;
  out.counts = gen.schedule == "dream" ? timesteps : spread;
  out.temperature = gen.temperature;
  if (gen.temperature == 0 && gen.remasking != "random") {
    out.predictor = std::make_shared<Greedy>(score);
  } else if (manifest.graphs.count("denoise_logits") == 0 && denoise.output("top_ids")) {
    out.predictor = std::make_shared<TopK>(gen.temperature, gen.remasking == "random");
  } else {
    manifest.graph("denoise_logits");  // throws manifest_error naming the re-export
    out.predictor = std::make_shared<Sampled>(gen.temperature, gen.remasking == "random");
  }
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
