#include "kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace seer {
namespace {

constexpr int64_t MAX_ORDER = 2;         // forecast orders 1 and 2 (seer_trt.contracts.policies.ORDERS)
constexpr double NODE_TOLERANCE = 1e-12;  // np.isclose(x, nodes, rtol=0, atol=1e-12): the step is a node

}  // namespace

void CacheConfig::validate() const {
  if (mode != "none" && mode != "reuse" && mode != "forecast")
    throw config_error("cache policy '" + mode + "' is not one of none, reuse, forecast");
  if (refresh < 1)
    throw config_error("refresh interval " + std::to_string(refresh) +
                       ": expected a whole number of steps >= 1 (1: every step computes the prompt)");
  if (order < 1 || order > MAX_ORDER)
    throw config_error("forecast order " + std::to_string(order) + " is not one of 1, 2");
}

void check_cache(const CacheConfig& config, const CacheSpec& spec) {
  if (config.mode != "none" && !spec.enabled)
    throw config_error("cache '" + config.mode + "': this export's denoise graph takes no prompt K/V cache (exported "
                       "before schema 2.1); re-export with seer-export, or use cache none");
}

CacheSpec cache_spec(const GraphEntry& window) {
  CacheSpec spec;
  constexpr size_t WINDOW_INPUTS = 4;  // prefix_embeds, gen_ids, segment_ids, position_ids
  const auto& in = window.inputs;
  if (in.size() <= WINDOW_INPUTS) return spec;  // a 2.0 export: no cache
  auto refuse = [&](const std::string& why) {
    return manifest_error("graph '" + window.name + "': its prompt K/V cache inputs " + why +
                          ", not the contract this C++ runtime feeds (seer_trt.contracts.graphs.cache_specs); rebuild the C++ "
                          "library from the seer-trt that exported the folder");
  };
  if (in[WINDOW_INPUTS].name != "past_weights" || in[WINDOW_INPUTS].dtype != "float32")
    throw refuse("start with " + in[WINDOW_INPUTS].name + " (" + in[WINDOW_INPUTS].dtype + ")");
  if ((in.size() - WINDOW_INPUTS - 1) % 2 != 0) throw refuse("are not key and value per layer");
  spec.enabled = true;
  spec.layers = static_cast<int64_t>((in.size() - WINDOW_INPUTS - 1) / 2);
  for (int64_t i = 0; i < spec.layers; ++i)
    for (const char* kind : {"key", "value"}) {
      spec.past.push_back("past_key_values." + std::to_string(i) + "." + kind);
      spec.present.push_back("present." + std::to_string(i) + "." + kind);
    }
  const std::vector<std::string> dynamic = {"history", "batch", "", "past", ""};
  for (size_t k = 0; k < spec.past.size(); ++k) {
    const TensorSpec& t = in[WINDOW_INPUTS + 1 + k];
    if (t.name != spec.past[k]) throw refuse("hold " + t.name + " where " + spec.past[k] + " belongs");
    if (t.dtype != window.precision || t.shape.size() != 5)
      throw refuse("hold " + t.name + " as " + t.dtype + " of rank " + std::to_string(t.shape.size()) +
                   ", expected " + window.precision + " [history, batch, kv_heads, past, head_dim]");
    for (size_t a = 0; a < dynamic.size(); ++a)
      if (dynamic[a].empty() ? t.shape[a].size < 1 : t.shape[a].name != dynamic[a])
        throw refuse("give " + t.name + " another shape than [history, batch, kv_heads, past, head_dim]");
    if (k == 0) spec.kv_heads = t.shape[2].size, spec.head_dim = t.shape[4].size;
    if (t.shape[2].size != spec.kv_heads || t.shape[4].size != spec.head_dim)
      throw refuse("give layers different kv_heads or head_dim (" + t.name + ")");
    if (!window.output(spec.present[k])) throw refuse("come without the output " + spec.present[k]);
  }
  return spec;
}

std::vector<float> forecast_weights(const std::vector<int64_t>& steps, int64_t t, double alpha) {
  const size_t m = steps.size();
  if (m == 1) return {1.0f};
  // the phase map (seer_trt.runtime.kv_cache.phase), operation for operation as numpy evaluates it
  double sum = 0;
  for (int64_t s : steps) sum += static_cast<double>(s);
  const double mean = sum / static_cast<double>(m);
  double spread = 0;
  for (int64_t s : steps) spread = std::max(spread, std::fabs(static_cast<double>(s) - mean));
  std::vector<double> nodes(m, 0.0);
  double x = 0;
  if (spread != 0) {
    for (size_t j = 0; j < m; ++j) nodes[j] = std::tanh(alpha * (static_cast<double>(steps[j]) - mean) / spread);
    x = std::tanh(alpha * (static_cast<double>(t) - mean) / spread);
  }
  // barycentric Lagrange weights, second kind (seer_trt.runtime.kv_cache.lagrange_weights)
  std::vector<double> w(m, 0.0);
  size_t hits = 0;
  for (size_t j = 0; j < m; ++j) hits += std::fabs(x - nodes[j]) <= NODE_TOLERANCE;
  if (hits) {
    for (size_t j = 0; j < m; ++j) w[j] = (std::fabs(x - nodes[j]) <= NODE_TOLERANCE) / static_cast<double>(hits);
  } else {
    double total = 0;
    for (size_t j = 0; j < m; ++j) {
      double prod = 1;
      for (size_t k = 0; k < m; ++k)
        if (k != j) prod *= nodes[j] - nodes[k];
      w[j] = 1.0 / prod / (x - nodes[j]);
      total += w[j];
    }
    for (double& v : w) v /= total;
  }
  return std::vector<float>(w.begin(), w.end());
}

void NoCache::bind(GraphCall& call, const CacheSpec& spec, const std::string& dtype, int64_t batch) {
  if (!spec.enabled) return;
  call.input("past_weights", &one, "float32", {1});
  for (const std::string& name : spec.past) call.input(name.c_str(), &empty, dtype, {1, batch, spec.kv_heads, 0, spec.head_dim});
}

GroupCache::GroupCache(const CacheConfig& config, const CacheSpec& spec, const std::string& dtype,
                       const Layout& layout, bool shifted)
    : config_(config), spec_(spec), dtype_(dtype), batch_(layout.batch), prompt_(layout.prompt), cached_(prompt_) {
  if (!spec.enabled || config.mode == "none") return;
  if (shifted) {  // seer_trt.runtime.kv_cache.last_prompt_columns: a non-padding position whose next column differs
    const int64_t seq = layout.prompt + layout.answer;
    for (int64_t j = 0; j < prompt_; ++j) {
      bool last = false;
      for (int64_t e = 0; e < batch_ && !last; ++e) {
        const int32_t s = layout.segment_ids[e * seq + j];
        last = s != 0 && (j == prompt_ - 1 || layout.segment_ids[e * seq + j + 1] != s);
      }
      (last ? live_ : kept_).push_back(j);
    }
    order_ = kept_;
    order_.insert(order_.end(), live_.begin(), live_.end());
    for (int64_t j = prompt_; j < seq; ++j) order_.push_back(j);
    cached_ = static_cast<int64_t>(kept_.size());
  }
  const size_t es = element_size(dtype);
  slot_bytes_ = static_cast<size_t>(batch_ * spec.kv_heads * cached_ * spec.head_dim) * es;
  fresh_bytes_ = static_cast<size_t>(batch_ * spec.kv_heads * prompt_ * spec.head_dim) * es;
  fresh_.assign(spec.past.size(), std::vector<uint8_t>(fresh_bytes_));
  history_.assign(spec.past.size(), std::vector<uint8_t>(slot_bytes_ * config.snapshots()));
}

void GroupCache::bind_refresh(GraphCall& call) {
  none_.bind(call, spec_, dtype_, batch_);
  for (size_t k = 0; k < fresh_.size(); ++k)
    call.output(spec_.present[k].c_str(), fresh_[k].data(), dtype_, {batch_, spec_.kv_heads, prompt_, spec_.head_dim});
}

bool GroupCache::refresh_due(int64_t t, bool boundary) const {
  return config_.mode == "none" || !spec_.enabled || steps_.empty() || boundary || t >= next_refresh_;
}

void GroupCache::bind_past(GraphCall& call, int64_t t) {
  const int64_t kept = static_cast<int64_t>(steps_.size());
  const bool forecast = config_.mode == "forecast" && kept > 1;
  const int64_t m = forecast ? kept : 1;
  const size_t first = forecast ? 0 : static_cast<size_t>(kept - 1);  // reuse: the newest snapshot alone
  weights_ = forecast ? forecast_weights(steps_, t, RESILPHASE_ALPHA) : std::vector<float>{1.0f};
  call.input("past_weights", weights_.data(), "float32", {m});
  for (size_t k = 0; k < history_.size(); ++k)
    call.input(spec_.past[k].c_str(), history_[k].data() + first * slot_bytes_, dtype_,
               {m, batch_, spec_.kv_heads, cached_, spec_.head_dim});
}

void GroupCache::store(int64_t t) {
  if (config_.mode == "none" || !spec_.enabled) return;
  const size_t keep = static_cast<size_t>(config_.snapshots());
  if (steps_.size() == keep) {  // drop the oldest snapshot
    steps_.erase(steps_.begin());
    for (auto& h : history_) std::memmove(h.data(), h.data() + slot_bytes_, (keep - 1) * slot_bytes_);
  }
  const size_t row = static_cast<size_t>(spec_.head_dim) * element_size(dtype_);  // one position of one head
  for (size_t k = 0; k < history_.size(); ++k) {
    uint8_t* dest = history_[k].data() + steps_.size() * slot_bytes_;
    if (live_.empty()) {
      std::memcpy(dest, fresh_[k].data(), slot_bytes_);
      continue;
    }
    for (int64_t eh = 0; eh < batch_ * spec_.kv_heads; ++eh)  // [b * H_kv] blocks of P rows -> of the kept rows
      for (size_t c = 0; c < kept_.size(); ++c)
        std::memcpy(dest + (eh * cached_ + c) * row, fresh_[k].data() + (eh * prompt_ + kept_[c]) * row, row);
  }
  steps_.push_back(t);
  next_refresh_ = t + config_.refresh;
}

void GroupCache::select(const std::vector<int64_t>& entries) {
  const int64_t k = static_cast<int64_t>(entries.size());
  if (spec_.enabled && config_.mode != "none") {
    const size_t entry = slot_bytes_ / static_cast<size_t>(batch_), slot = entry * k;
    // in place, front to back: an entry only moves towards the start, past what is already moved
    for (auto& h : history_)
      for (size_t s = 0; s < steps_.size(); ++s)
        for (int64_t e = 0; e < k; ++e)
          std::memmove(h.data() + s * slot + e * entry, h.data() + s * slot_bytes_ + entries[e] * entry, entry);
    slot_bytes_ = slot;
  }
  batch_ = k;
}

}  // namespace seer
