#include "denoise.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

namespace seer {
namespace {

constexpr double NEG_INF = -std::numeric_limits<double>::infinity();
std::atomic<int64_t> next_key{1};

// The live rows of one class: those that share a window graph and compute their prompt, or read it with equal weights.
struct Class {
  std::string graph;
  bool cached;                  // "cached" (reads their K/V with `weights`), else "prompt" (computes their prompts)
  std::vector<float> weights;   // [M] the snapshot weights a cached class reads with
  std::vector<int64_t> members;  // indices into the step's live rows
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {  // bit for bit, as weights.tobytes() compare
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// One window-graph call made once for the same rows: its layout, its buffers and its bindings (bound again only
// when the K/V buffer it is bound to, or the history it reads, changes).
struct Loop::Call {
  Layout layout;
  std::vector<int64_t> gen_ids;                   // [b, g]
  std::vector<const TensorSpec*> reads;           // the outputs its rows' predictors read, in graph order
  std::vector<std::vector<float>> floats;         // [reads][b, g(, width)] the float32 ones
  std::vector<std::vector<int64_t>> ints;         // [reads][b, g(, width)] the int64 ones
  CallOutputs outputs;                            // views of them
  std::vector<float> weights;                     // a cached call's past_weights [M]
  NoCache none;                                   // a call that computes its prompts: the empty cache
  std::optional<GraphCall> bound;
  std::array<uint64_t, 2> state{};                // what the bindings hold: (K/V buffer id, history M)
};

Row::Row(std::shared_ptr<const RowSettings> settings_, Prefix prefix_, std::vector<int64_t> transfer_,
         std::vector<int64_t> block_end_, std::vector<float> fraction_, int64_t kept, int64_t mask_id)
    : settings(std::move(settings_)), prefix(std::move(prefix_)), transfer(std::move(transfer_)),
      block_end(std::move(block_end_)), fraction(std::move(fraction_)), x(kept, mask_id), cache(settings->cache),
      stop(kept), key(next_key++) {}

bool Row::live(int64_t mask_id) const {
  if (t >= cap()) return false;
  for (int64_t j = 0; j < stop; ++j)
    if (x[j] == mask_id) return true;
  return false;
}

int64_t Row::count(int64_t open_masks) const {
  const size_t i = std::min(static_cast<size_t>(t), transfer.size() - 1);
  if (fraction.empty()) return transfer[i];
  const float f = fraction[i];
  return std::isinf(f) ? open_masks : static_cast<int64_t>(static_cast<float>(open_masks) * f);
}

Loop::Loop(const LoopSettings& settings)
    : s_(settings), mask_(settings.manifest.special.mask_id),
      row_bytes_(settings.manifest.hidden_size * element_size(settings.manifest.precision)),
      confidence_(confidence_output(settings.manifest.graph("denoise"))) {
  if (s_.pool) {
    geometry_ = s_.pool->geometry();
    buffers_ = std::make_unique<CallBuffers>(*s_.pool, s_.manifest.buckets.batch.back());
  }
}

Loop::~Loop() { close(); }

// --- rows --------------------------------------------------------------------------------------------------------

size_t Loop::add(const std::vector<Row*>& rows, size_t from) {
  size_t added = 0;
  for (size_t i = from; i < rows.size() && reserve(*rows[i]); ++i, ++added) rows_.push_back(rows[i]);
  return added;
}

bool Loop::reserve(Row& row) {
  if (row.cache.slot || !row.cache.stores() || !s_.pool) return true;
  row.cache.slot = s_.pool->reserve(slot_positions(row), row.cache.config.snapshots());
  return row.cache.slot != nullptr;
}

int64_t Loop::slot_positions(const Row& row) const { return row.prefix.size() - (s_.manifest.logit_shift ? 1 : 0); }

void Loop::remove(Row* row) {
  rows_.erase(std::remove(rows_.begin(), rows_.end(), row), rows_.end());
  if (row->cache.slot && s_.pool) s_.pool->release(row->cache.slot);
  if (buffers_) buffers_->forget(row->key);
}

void Loop::retire() {
  std::vector<Row*> done;
  for (Row* r : rows_)
    if (!r->live(mask_)) done.push_back(r);
  for (Row* r : done) remove(r);
}

void Loop::close() {
  for (Row* r : std::vector<Row*>(rows_)) remove(r);
  if (buffers_) buffers_->close();
}

// --- a step ------------------------------------------------------------------------------------------------------

// The step's view of its live rows: where each may commit and the block it works in.
struct Loop::Window {
  int64_t width = 0;                  // L_max
  std::vector<char> open;             // [n, L_max] masked, inside the window, before the stop
  std::vector<int64_t> open_masks;    // [n] of them
  std::vector<int64_t> block_end;     // [n] the block a row works in at this step
  std::vector<char> boundary;         // [n] a row's block changes at t
  std::vector<char> refreshed;        // [n] its call computed its prompt

  Window(const std::vector<Row*>& rows, int64_t mask) {
    const int64_t n = static_cast<int64_t>(rows.size());
    for (const Row* r : rows) width = std::max(width, r->kept());
    open.assign(n * width, 0), open_masks.assign(n, 0), block_end.assign(n, 0), boundary.assign(n, 0);
    refreshed.assign(n, 0);
    for (int64_t i = 0; i < n; ++i) {
      const Row& r = *rows[i];
      int64_t first = -1;  // the row's first position still to commit
      for (int64_t j = 0; j < r.kept(); ++j) {
        const bool o = r.x[j] == mask && j < r.stop;
        open[i * width + j] = o;
        open_masks[i] += o;
        if (o && first < 0) first = j;
      }
      // the fixed rule's block from the schedule; the others' the block of the first position still to commit
      const int64_t block = r.settings->block_length;
      block_end[i] = r.settings->decoding.rule->fixed()
                         ? r.block_end[std::min(static_cast<size_t>(r.t), r.block_end.size() - 1)]
                         : std::min(r.kept(), (std::max<int64_t>(first, 0) / block + 1) * block);
      boundary[i] = r.t > 0 && block_end[i] != r.end;
    }
  }
};

bool Loop::step() {
  std::vector<Row*> rows;
  for (Row* r : rows_)
    if (r->live(mask_)) rows.push_back(r);
  if (rows.empty()) return false;
  Window w(rows, mask_);
  predict(rows, w);
  commit(rows, w);
  return true;
}

// x0 and the log-probability of every live row's window: from step zero, or from the step's graph calls, the rows
// classed by (window graph, whether they compute their prompt or read it with which weights) in the order of each
// class's first row, each class split into calls by the policy.
void Loop::predict(const std::vector<Row*>& rows, Window& w) {
  const int64_t n = static_cast<int64_t>(rows.size()), width = w.width;
  x0_.assign(n * width, mask_);
  conf_.assign(n * width, NEG_INF);
  if (buffers_) buffers_->begin_step();
  std::vector<Class> classes;
  for (int64_t i = 0; i < n; ++i) {
    Row& r = *rows[i];
    if (r.t == 0 && !r.step0_x0.empty()) {  // the full-depth step zero already predicted step 0
      for (int64_t j = 0; j < r.kept(); ++j)
        x0_[i * width + j] = r.step0_x0[j], conf_[i * width + j] = static_cast<double>(r.step0_confidence[j]);
      continue;
    }
    const std::optional<std::vector<float>> weights = r.cache.plan(r.t, w.boundary[i]);
    const std::string graph = r.settings->decoding.graph();
    auto it = std::find_if(classes.begin(), classes.end(), [&](const Class& c) {
      return c.graph == graph && c.cached == weights.has_value() && (!weights || same(c.weights, *weights));
    });
    if (it == classes.end())
      it = classes.insert(classes.end(), Class{graph, weights.has_value(), weights.value_or(std::vector<float>{}), {}});
    it->members.push_back(i);
  }
  for (const Class& c : classes) {
    std::vector<Row*> members;
    for (int64_t i : c.members) members.push_back(rows[i]);
    if (c.cached) {
      cached_calls(c.graph, members, c.members, c.weights, width);
    } else {
      prompt_calls(c.graph, members, c.members, width);
      for (int64_t i : c.members) w.refreshed[i] = 1;
    }
  }
}

// Each rule's commit over its rows (in first-seen order), then back into the rows: tokens, stop, step, block.
void Loop::commit(const std::vector<Row*>& rows, const Window& w) {
  const int64_t n = static_cast<int64_t>(rows.size()), width = w.width;
  std::vector<char> eligible(n * width, 0), chosen(n * width, 0);
  std::vector<int64_t> counts(n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      eligible[i * width + j] = w.open[i * width + j] && j < w.block_end[i];
      if (!eligible[i * width + j]) conf_[i * width + j] = NEG_INF;
    }
    counts[i] = rows[i]->count(w.open_masks[i]);
  }
  std::vector<std::pair<const Rule*, std::vector<int64_t>>> rules;
  for (int64_t i = 0; i < n; ++i) {
    const Rule* rule = rows[i]->settings->decoding.rule.get();
    auto it = std::find_if(rules.begin(), rules.end(), [&](const auto& g) { return *g.first == *rule; });
    if (it == rules.end()) it = rules.insert(rules.end(), {rule, {}});
    it->second.push_back(i);
  }
  for (const auto& [rule, members] : rules)
    rule->commit(members, conf_.data(), eligible.data(), counts.data(), width, chosen.data());
  for (int64_t i = 0; i < n; ++i) {
    Row& r = *rows[i];
    for (int64_t j = 0; j < r.kept(); ++j)
      if (chosen[i * width + j]) r.x[j] = x0_[i * width + j];
    if (r.settings->stop_id) {
      const auto hit = std::find(r.x.begin(), r.x.end(), *r.settings->stop_id);
      r.stop = static_cast<int64_t>(hit - r.x.begin());
    }
    r.t += 1;
    r.used += 1;
    r.refreshes += w.refreshed[i];
    r.end = w.block_end[i];
  }
}

Loop::Call& Loop::memo(const std::vector<int64_t>& key, const std::function<Layout()>& make) {
  auto found = by_key_.find(key);
  if (found != by_key_.end()) {
    calls_.splice(calls_.end(), calls_, found->second);
    return *found->second->second;
  }
  auto call = std::make_unique<Call>();
  call->layout = make();
  call->gen_ids.assign(call->layout.batch * call->layout.answer, mask_);  // the cells past a row's window: the mask
  layout_bytes_ += call->layout.bytes();
  calls_.emplace_back(key, std::move(call));
  by_key_[key] = std::prev(calls_.end());
  while (layout_bytes_ > LAYOUT_BYTES && calls_.size() > 1) {
    layout_bytes_ -= calls_.front().second->layout.bytes();
    by_key_.erase(calls_.front().first);
    calls_.pop_front();
  }
  return *calls_.back().second;
}

// A call's window inputs (prefix_embeds, gen_ids, segment_ids, position_ids) and the outputs its rows' predictors
// read (x0 and the log-probability, a 2.1 export's confidence, or a Dream score; the logits; the top ids), in the
// graph's order. The caller binds the cache's inputs and outputs.
GraphCall Loop::bind(const std::string& graph, Call& call, const std::vector<Row*>& members) {
  const Manifest& m = s_.manifest;
  Layout& l = call.layout;
  GraphCall c = s_.backend.call(graph, s_.clock);
  c.input("prefix_embeds", l.prefix_embeds.empty() ? static_cast<void*>(&call.none.empty) : l.prefix_embeds.data(),
          m.precision, {l.batch, l.prompt, m.hidden_size});
  c.input("gen_ids", call.gen_ids.data(), "int64", {l.batch, l.answer});
  c.input("segment_ids", l.segment_ids.data(), "int32", {l.batch, l.seq()});
  c.input("position_ids", l.position_ids.data(), "int64", {l.batch, l.seq()});

  const GraphEntry& entry = m.graph(graph);
  std::set<std::string> wanted;
  for (const Row* r : members)
    for (const std::string& name : r->settings->decoding.predictor->reads(entry, confidence_.name))
      wanted.insert(name);
  call.reads.clear();
  for (const TensorSpec& t : entry.outputs)
    if (wanted.count(t.name)) call.reads.push_back(&t);
  call.floats.assign(call.reads.size(), {});
  call.ints.assign(call.reads.size(), {});
  call.outputs = CallOutputs{};
  for (size_t o = 0; o < call.reads.size(); ++o) {
    const TensorSpec& t = *call.reads[o];
    const int64_t width = t.shape.size() > 2 ? t.shape.back().size : 1;  // [b, g] or [b, g, k | V]
    std::vector<int64_t> shape = {l.batch, l.answer};
    if (t.shape.size() > 2) shape.push_back(width);
    CallOutputs::Output view;
    view.width = width;
    if (t.dtype == "int64") {
      call.ints[o].assign(call.gen_ids.size() * width, 0);
      c.output(t.name.c_str(), call.ints[o].data(), "int64", shape);
      view.i = call.ints[o].data();
    } else {
      call.floats[o].assign(call.gen_ids.size() * width, 0.0f);
      c.output(t.name.c_str(), call.floats[o].data(), "float32", shape);
      view.f = call.floats[o].data();
    }
    call.outputs.outputs.emplace_back(t.name, view);
    if (t.name == confidence_.name) call.outputs.log_confidence = view.f;
  }
  return c;
}

// gen_ids from the members' windows, the graph call, then each member's predictor over its cells: its prediction and
// log-probability (or score, or random rank) into the step's x0 / confidence at its row `at`.
void Loop::run(Call& call, const std::vector<Row*>& members, const std::vector<int64_t>& at, int64_t width) {
  const Layout& l = call.layout;
  for (size_t k = 0; k < members.size(); ++k)
    for (int64_t j = 0; j < members[k]->kept(); ++j) call.gen_ids[l.slot[k * l.width + j]] = members[k]->x[j];
  call.bound->run();
  for (size_t o = 0; o < call.reads.size(); ++o)
    if (call.reads[o]->name == confidence_.name && !confidence_.is_log)  // a 2.1 export: numpy's float32 log
      log_in_place(call.floats[o].data(), call.floats[o].size());
  // a call draws within nuclei when a row of it has top_p < 1 (Python's decoder takes the call's rows' top_p)
  bool nucleus = false;
  for (const Row* r : members) nucleus = nucleus || r->top_p < 1.0;
  std::vector<int64_t> cells;
  for (size_t k = 0; k < members.size(); ++k) {
    const Row& r = *members[k];
    const Decoding& d = r.settings->decoding;
    cells.assign(l.slot.begin() + k * l.width, l.slot.begin() + k * l.width + r.kept());
    const Draw draw{r.seed, r.t, r.top_p, nucleus && d.temperature > 0};
    d.predictor->predict(call.outputs, cells.data(), r.kept(), draw, &x0_[at[k] * width], &conf_[at[k] * width]);
  }
}

// The calls of the rows that compute their prompt this step (split by the policy), their K/V stored.
int64_t Loop::prompt_calls(const std::string& graph, const std::vector<Row*>& rows, const std::vector<int64_t>& idx,
                           int64_t width) {
  std::vector<int64_t> lengths, kept;
  for (const Row* r : rows) lengths.push_back(r->prefix.size()), kept.push_back(r->kept());
  const DispatchPlan plan = plan_dispatch(lengths, kept, std::vector<int64_t>(rows.size(), 1), s_.manifest.buckets,
                                          s_.policy, s_.tau_pad, s_.short_rows, s_.cost);
  const Manifest& m = s_.manifest;
  for (const Group& group : plan.groups) {
    std::vector<Row*> members;
    std::vector<int64_t> at;
    for (int64_t r : group.rows) members.push_back(rows[r]), at.push_back(idx[r]);
    std::vector<int64_t> key = {0, group.path == "packed" ? 1 : group.path == "eager" ? 2 : 0, group.prompt_len,
                                group.gen_len};
    for (const Row* r : members) key.push_back(r->key);
    Call& call = memo(key, [&] {
      std::vector<const Prefix*> prefixes;
      std::vector<int64_t> windows;
      for (const Row* r : members) prefixes.push_back(&r->prefix), windows.push_back(r->kept());
      return group.path == "packed" ? rows_packed(prefixes, windows, row_bytes_)
                                    : rows_padded(prefixes, windows, group.prompt_len, group.gen_len, row_bytes_);
    });
    const Layout& l = call.layout;
    std::vector<size_t> storing;
    for (size_t k = 0; k < members.size(); ++k)
      if (members[k]->cache.slot) storing.push_back(k);
    CallBuffers::Buffer* present =
        storing.empty() || !buffers_ ? nullptr : &buffers_->present_into(l.batch, l.prompt);
    const std::array<uint64_t, 2> state = {present ? present->id : 0, 0};
    if (!call.bound || call.state != state) {
      GraphCall c = bind(graph, call, members);
      call.none.bind(c, s_.cache_spec, m.precision, l.batch);
      if (present)  // the refresh's K/V written by the graph into the loop's present buffer
        bind_present(c, s_.cache_spec, *geometry_, present->data.data(), l.batch, l.prompt);
      call.bound.emplace(std::move(c));
      call.state = state;
    }
    run(call, members, at, width);
    for (size_t k : storing) {  // each refreshing row's columns into its slot
      Row& r = *members[k];
      const int64_t index = r.cache.target();
      s_.pool->store(*r.cache.slot, index, present->data.data(), l.batch, l.prompt, l.entry[k], l.column[k]);
      r.cache.stored(r.t, index);
    }
  }
  return static_cast<int64_t>(plan.groups.size());
}

// The calls of the rows that read their prompt K/V this step with `weights` (split by the policy).
int64_t Loop::cached_calls(const std::string& graph, const std::vector<Row*>& rows, const std::vector<int64_t>& idx,
                           const std::vector<float>& weights, int64_t width) {
  const Manifest& m = s_.manifest;
  const int64_t live = m.logit_shift ? 1 : 0, history = static_cast<int64_t>(weights.size());
  std::vector<int64_t> past, kept;
  for (const Row* r : rows) past.push_back(r->cache.slot->positions), kept.push_back(r->kept());
  const std::vector<Group> groups = plan_cached(past, kept, live, m.buckets, s_.policy, s_.cost);
  for (const Group& group : groups) {
    std::vector<int64_t> keys;
    for (int64_t r : group.rows) keys.push_back(rows[r]->key);
    std::vector<Row*> members;  // in the order that keeps rows in their call-buffer entries
    std::vector<int64_t> at;
    std::vector<int64_t> key = {1, 0, group.past_len, group.gen_len};
    const auto [handle, order] = buffers_->past_call(keys, history, group.past_len);
    for (int64_t e : order) {
      members.push_back(rows[group.rows[e]]), at.push_back(idx[group.rows[e]]);
      key.push_back(members.back()->key);
    }
    Call& call = memo(key, [&] {
      std::vector<const Prefix*> prefixes;
      std::vector<int64_t> windows;
      for (const Row* r : members) prefixes.push_back(&r->prefix), windows.push_back(r->kept());
      return rows_cached(prefixes, windows, group.past_len, group.gen_len, live != 0, row_bytes_);
    });
    const Layout& l = call.layout;
    std::vector<CallBuffers::PastRow> entries;
    for (const Row* r : members) entries.push_back({r->key, r->cache.slot.get(), r->cache.fed(weights.size())});
    CallBuffers::Past& buffer = buffers_->past_feeds(handle, entries);
    call.weights.assign(weights.begin(), weights.end());
    const std::array<uint64_t, 2> state = {buffer.buffer.id, static_cast<uint64_t>(history)};
    if (!call.bound || call.state != state) {
      GraphCall c = bind(graph, call, members);
      bind_past(c, s_.cache_spec, *geometry_, buffer, l.batch, call.weights);
      call.bound.emplace(std::move(c));
      call.state = state;
    }
    run(call, members, at, width);
  }
  return static_cast<int64_t>(groups.size());
}

}  // namespace seer
