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

KVGeometry KVGeometry::of(const CacheSpec& spec, const std::string& dtype) {
  return {spec.layers, spec.kv_heads, spec.head_dim, dtype, element_size(dtype)};
}

void copy_columns(uint8_t* dst, int64_t dst_cols, int64_t dst_col, const uint8_t* src, int64_t src_cols,
                  int64_t src_col, int64_t count, int64_t lead, size_t column_bytes) {
  for (int64_t h = 0; h < lead; ++h)
    std::memcpy(dst + (h * dst_cols + dst_col) * column_bytes, src + (h * src_cols + src_col) * column_bytes,
                count * column_bytes);
}

KVPool::KVPool(const KVGeometry& geometry, int64_t budget) : geometry_(geometry), budget_(budget) {
  if (budget < 0)
    throw config_error("K/V budget " + std::to_string(budget) + ": expected a whole number of bytes >= 0");
}

int64_t KVPool::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

int64_t KVPool::buffer_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_;
}

size_t KVPool::slot_bytes(int64_t positions, int64_t snapshots) const {
  return static_cast<size_t>(positions * snapshots) * geometry_.position_bytes();
}

std::unique_ptr<Slot> KVPool::reserve(int64_t positions, int64_t snapshots) {
  const size_t nbytes = slot_bytes(positions, snapshots);
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (used_ + static_cast<int64_t>(nbytes) > budget_) return nullptr;
    used_ += static_cast<int64_t>(nbytes);
    slots_ += 1;
    id = next_id_++;
  }
  auto slot = std::make_unique<Slot>();
  try {
    slot->data.assign(nbytes, 0);
  } catch (...) {
    release_bytes(nbytes, 1);
    throw;
  }
  slot->positions = positions, slot->nbytes = nbytes, slot->id = id;
  slot->versions.assign(snapshots, 0);
  return slot;
}

void KVPool::release(std::unique_ptr<Slot>& slot) {
  const size_t nbytes = slot->nbytes;
  slot.reset();
  release_bytes(nbytes, 1);
}

void KVPool::claim(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_ += static_cast<int64_t>(nbytes);
}

void KVPool::unclaim(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_ -= static_cast<int64_t>(nbytes);
}

void KVPool::release_bytes(size_t nbytes, int64_t slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= static_cast<int64_t>(nbytes);
  slots_ -= slots;
}

void KVPool::store(Slot& slot, int64_t index, const uint8_t* present, int64_t batch, int64_t prompt, int64_t entry,
                   int64_t column) {
  const KVGeometry& g = geometry_;
  const size_t block = static_cast<size_t>(g.kv_heads * prompt) * g.column_bytes();  // one entry of one layer's key
  for (int64_t i = 0; i < g.layers; ++i)
    for (int64_t j = 0; j < 2; ++j)
      copy_columns(slot.data.data() + slot.offset(g, index, i, j), slot.positions, 0,
                   present + ((i * 2 + j) * batch + entry) * block,
                   prompt, column, slot.positions, g.kv_heads, g.column_bytes());
  slot.versions[index] += 1;
}

std::optional<std::vector<float>> RowCache::plan(int64_t t, bool boundary) const {
  if (config.mode == "none" || steps_.empty() || boundary || t >= next_refresh_) return std::nullopt;
  if (config.mode == "forecast" && steps_.size() > 1) return forecast_weights(steps_, t, RESILPHASE_ALPHA);
  return std::vector<float>{1.0f};
}

std::vector<int64_t> RowCache::fed(size_t history) const {
  return std::vector<int64_t>(held_.end() - static_cast<int64_t>(history), held_.end());
}

int64_t RowCache::target() const {
  for (int64_t i = 0; i < config.snapshots(); ++i)
    if (std::find(held_.begin(), held_.end(), i) == held_.end()) return i;
  return held_.front();
}

void RowCache::stored(int64_t t, int64_t index) {
  auto at = std::find(held_.begin(), held_.end(), index);
  if (at != held_.end()) {
    steps_.erase(steps_.begin() + (at - held_.begin()));
    held_.erase(at);
  }
  held_.push_back(index);
  steps_.push_back(t);
  const size_t keep = static_cast<size_t>(config.snapshots());
  if (held_.size() > keep) {
    held_.erase(held_.begin(), held_.end() - keep);
    steps_.erase(steps_.begin(), steps_.end() - keep);
  }
  next_refresh_ = t + config.refresh;
}

CallBuffers::Buffer CallBuffers::alloc(size_t nbytes) {
  Buffer b{std::vector<uint8_t>(nbytes, 0), next_id_++};
  pool_.claim(nbytes);
  return b;
}

CallBuffers::Buffer& CallBuffers::present_into(int64_t batch, int64_t prompt) {
  const std::pair<int64_t, int64_t> key = {batch, prompt};
  auto it = std::find_if(present_.begin(), present_.end(), [&](const auto& p) { return p.first == key; });
  if (it != present_.end()) {
    present_.splice(present_.end(), present_, it);
  } else {
    const KVGeometry& g = pool_.geometry();
    const size_t nbytes = static_cast<size_t>(g.layers * 2 * batch * g.kv_heads * prompt) * g.column_bytes();
    present_.emplace_back(key, alloc(nbytes));
    while (present_.size() > PRESENT_KEPT) {
      pool_.unclaim(present_.front().second.data.size());
      present_.pop_front();
    }
  }
  return present_.back().second;
}

void CallBuffers::begin_step() { taken_.clear(); }

std::pair<CallBuffers::Handle, std::vector<int64_t>> CallBuffers::past_call(const std::vector<int64_t>& keys,
                                                                            int64_t history, int64_t past) {
  const int64_t b = static_cast<int64_t>(keys.size());
  // reuse (M = 1) binds the first B entries of a buffer of `capacity`; a forecast call's [M, B] must be contiguous,
  // so it has a buffer of its own batch
  const std::array<int64_t, 3> shape = {history, past, history == 1 ? capacity_ : b};
  const Handle handle = {shape[0], shape[1], shape[2], taken_[shape]++};
  std::vector<int64_t> order(b);
  auto found = past_.find(handle);
  if (found == past_.end()) {
    for (int64_t i = 0; i < b; ++i) order[i] = i;
    return {handle, order};
  }
  auto index = [&](int64_t k) { return std::find(keys.begin(), keys.end(), k) - keys.begin(); };
  std::vector<int64_t> entries(b, 0), waiting;  // 0: a free entry
  for (int64_t e = 0; e < b; ++e) {  // an entry past a smaller call's rows may still name a row placed since
    const int64_t row = found->second.rows[e];
    if (index(row) < b && std::find(entries.begin(), entries.begin() + e, row) == entries.begin() + e) entries[e] = row;
  }
  for (int64_t k : keys)
    if (std::find(entries.begin(), entries.end(), k) == entries.end()) waiting.push_back(k);
  size_t next = 0;
  for (int64_t e = 0; e < b; ++e) order[e] = index(entries[e] ? entries[e] : waiting[next++]);
  return {handle, order};
}

CallBuffers::Past& CallBuffers::past_feeds(const Handle& handle, const std::vector<PastRow>& rows) {
  const KVGeometry& g = pool_.geometry();
  const int64_t b = static_cast<int64_t>(rows.size()), history = handle[0], past = handle[1];
  auto found = past_.find(handle);
  if (found == past_.end()) {
    Past made;
    made.history = history, made.past = past, made.entries = handle[2];
    made.buffer = alloc(static_cast<size_t>(g.layers * 2 * history * made.entries * g.kv_heads * past) *
                        g.column_bytes());
    made.rows.assign(made.entries, 0);
    found = past_.emplace(handle, std::move(made)).first;
  }
  Past& buffer = found->second;
  const size_t entry = static_cast<size_t>(g.kv_heads * past) * g.column_bytes();  // [H_kv, past, hd]
  for (int64_t e = 0; e < b; ++e) {
    const PastRow& row = rows[e];
    buffer.rows[e] = row.key;
    for (int64_t m = 0; m < history; ++m) {
      const int64_t index = row.fed[m];
      const std::array<int64_t, 3> tag = {row.slot->id, index, row.slot->versions[index]};
      auto at = buffer.tags.find({m, e});
      if (at != buffer.tags.end() && at->second == tag) continue;
      for (int64_t i = 0; i < g.layers; ++i)
        for (int64_t j = 0; j < 2; ++j)
          copy_columns(buffer.buffer.data.data() + (((i * 2 + j) * history + m) * buffer.entries + e) * entry, past,
                       past - row.slot->positions, row.slot->data.data() + row.slot->offset(g, index, i, j),
                       row.slot->positions, 0, row.slot->positions, g.kv_heads, g.column_bytes());
      buffer.tags[{m, e}] = tag;
    }
  }
  for (int64_t e = b; e < buffer.entries; ++e) {  // entries past this call's rows name no row of it
    const int64_t k = buffer.rows[e];
    if (k && std::any_of(rows.begin(), rows.end(), [&](const PastRow& r) { return r.key == k; })) {
      buffer.rows[e] = 0;
      for (int64_t m = 0; m < history; ++m) buffer.tags.erase({m, e});
    }
  }
  return buffer;
}

void CallBuffers::forget(int64_t row) {
  for (auto& [k, buffer] : past_)
    for (int64_t e = 0; e < buffer.entries; ++e)
      if (buffer.rows[e] == row) {
        buffer.rows[e] = 0;
        for (int64_t m = 0; m < buffer.history; ++m) buffer.tags.erase({m, e});
      }
}

void CallBuffers::close() {
  for (const auto& [k, buffer] : past_) pool_.unclaim(buffer.buffer.data.size());
  for (const auto& [k, buffer] : present_) pool_.unclaim(buffer.data.size());
  past_.clear();
  present_.clear();
}

void bind_present(GraphCall& call, const CacheSpec& spec, const KVGeometry& g, uint8_t* present, int64_t batch,
                  int64_t prompt) {
  const size_t block = static_cast<size_t>(batch * g.kv_heads * prompt) * g.column_bytes();  // one layer's key
  for (size_t k = 0; k < spec.present.size(); ++k)  // key, value of layer 0, then of layer 1, ...
    call.output(spec.present[k].c_str(), present + k * block, g.dtype, {batch, g.kv_heads, prompt, g.head_dim});
}

void bind_past(GraphCall& call, const CacheSpec& spec, const KVGeometry& g, CallBuffers::Past& past, int64_t batch,
               std::vector<float>& weights) {
  call.input("past_weights", weights.data(), "float32", {past.history});
  // per layer key and value [M, entries, H_kv, past, hd]: reuse binds the first B entries of its one snapshot, a
  // forecast's buffer holds exactly B
  const size_t block = static_cast<size_t>(past.history * past.entries * g.kv_heads * past.past) * g.column_bytes();
  uint8_t* data = past.buffer.data.data();
  for (size_t k = 0; k < spec.past.size(); ++k)
    call.input(spec.past[k].c_str(), data + k * block, g.dtype,
               {past.history, batch, g.kv_heads, past.past, g.head_dim});
}

}  // namespace seer
