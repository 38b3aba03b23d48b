// Stage 5, denoise: the one denoising loop, over every live row at once (seer_trt/runtime/denoise.py, docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly", "Decoding strategies", "Serving and embedding").
//
// In:  Rows: each request's state across steps (its prefix, answer window, step, block, kept window, decoding,
//      schedule, prompt K/V cache and its slot), added at step boundaries as their slots fit; LoopSettings: the
//      backend, the export, its K/V pool, the dispatch policy.
// Out: each row's answer tokens, the steps it took part in and the refreshes of its prompt, as it steps.
//
// Per step, LLaDA-V's generate_with_embeds for every live row: the row's Predictor (decoding.hpp) reads x0 and its
// log-probability at every position from the graph (special ids suppressed in the graph; a 2.1 export's probability
// is logged here, as numpy does), or a Dream score it returns, or draws x0 from the logits or the top ids with the
// row's seed and step (Sampled, TopK); positions past the row's block are not eligible; then the row's rule commits
// (decoding.hpp: fixed, threshold:τ, factor:f), comparing float64 log-probabilities. Under fixed the block comes from
// the row's schedule; under threshold and factor a row's block is the one of its first position still to commit, and
// a row may take as many steps as its window has positions. With early stopping a row that has committed <|eot_id|>
// commits only before its first one and is done when nothing before it is masked.
//
// Rows, not groups, step together: whatever step, settings, rule, window, block or refresh schedule each row has, a
// step forms its graph calls from all live rows, as Python's Loop.step does (the same classes, splits, layouts and
// row order in each call, so ONNX Runtime sees the same inputs):
//
//     live rows ─► step 0 predicted at full depth (no call)
//               ─► prompt rows (cache none, or a refresh: the prompt computed)  ─┐ per window graph, split by the
//               ─► cached rows (the prompt K/V read, by snapshot weights)       ─┘ policy (plan_dispatch,
//                                                                                 plan_cached): a graph call each
//               ─► each row's prediction from its call's outputs ─► each rule's commit over its rows
//               ─► tokens, steps
//
// A refresh writes its rows' K/V into their slots (kv_cache.hpp); a cached call reads them. A call's layout, buffers
// and bindings are made once for the same rows and kept while they recur (least recently used out past a byte bound),
// so a step that forms the calls of the step before rewrites gen_ids in place and runs them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "decoding.hpp"
#include "dispatch.hpp"
#include "kv_cache.hpp"
#include "layout.hpp"

namespace seer {

// How one row decodes, chosen once when its request is prepared: the loop's settings object of a row.
struct RowSettings {
  Decoding decoding;               // its window graph, rule, score and counts (decoding.hpp: choose)
  std::optional<int64_t> stop_id;  // early stopping at this id (<|eot_id|>); none: until the window is committed
  CacheConfig cache;               // the prompt K/V cache policy
  int64_t block_length = 0;        // the blocks of threshold and factor (its window, when one block)
};

// One request's state across steps, the record the loop moves between calls.
struct Row {
  Row(std::shared_ptr<const RowSettings> settings, Prefix prefix, std::vector<int64_t> transfer,
      std::vector<int64_t> block_end, std::vector<float> fraction, int64_t kept, int64_t mask_id);

  std::shared_ptr<const RowSettings> settings;
  Prefix prefix;                   // [C, D] what a refresh computes: Seer's end tail, then the prompt's embeddings
  std::vector<int64_t> transfer;   // [T] tokens the fixed rule commits at each of the row's steps
  std::vector<int64_t> block_end;  // [T] the fixed rule's block end at each step
  std::vector<float> fraction;     // [T] Dream's timestep fractions (Timesteps counts), else empty
  std::vector<int64_t> x;          // [kept] the answer window as it stands
  RowCache cache;
  std::vector<int64_t> step0_x0;   // [kept] a full-depth step zero's x0, and its log-probability; empty: none
  std::vector<float> step0_confidence;
  int64_t t = 0;          // steps taken
  int64_t used = 0;       // steps it still had a position to commit in (Result::steps)
  int64_t refreshes = 0;  // of those, the calls that computed its prompt
  int64_t stop;           // first committed stop id (kept: none)
  int64_t end = 0;        // its block end at the previous step
  std::string error;      // why it never stepped (its prompt K/V can never fit the pool)
  uint64_t seed = 0;      // sampling noise (temperature > 0, random remasking): Request::seed
  double top_p = 1.0;     // nucleus mass of sampling: Request::top_p
  int64_t key;            // unique in the process: what a call buffer's entry and a memoised call name it by

  int64_t kept() const { return static_cast<int64_t>(x.size()); }
  // steps it may take: its schedule's under the fixed rule, else its window (each step commits one)
  int64_t cap() const { return settings->decoding.rule->fixed() ? static_cast<int64_t>(transfer.size()) : kept(); }
  bool live(int64_t mask_id) const;  // a position to commit and steps left
  // tokens the fixed rule commits at this step: the planned count, or under Dream's timesteps int(m * (1 - t[i + 1] /
  // t[i])) of the m masks still open (float32), all of them at its last step
  int64_t count(int64_t open_masks) const;
};

// What the loop needs besides its rows (one object, not a dozen arguments).
struct LoopSettings {
  Backend& backend;
  const Manifest& manifest;      // mask id, buckets (the shapes calls are padded to), precision, logit shift, outputs
  const CacheSpec& cache_spec;   // the window graph's cache inputs and outputs
  std::string policy;            // how a step's rows are split into calls (dispatch.hpp)
  double tau_pad = 0.2;          // hybrid: padding share past which a group is packed
  int64_t short_rows = 4;        // hybrid: rows this short form groups of their own
  const CostModel* cost = nullptr;  // cost_model: the backend's step costs
  KVPool* pool = nullptr;        // the rows' prompt K/V slots (none: no row caches its prompt)
  std::atomic<int64_t>* clock = nullptr;  // nanoseconds in the graphs
};

// The one loop's state over its rows: add rows at any step boundary, step advances every live row once, remove takes
// a row out (its slot freed). The caller owns the rows; the loop holds them while they step.
class Loop {
 public:
  static constexpr size_t LAYOUT_BYTES = 64u << 20;  // memoised calls' layouts, least recently used out past this

  explicit Loop(const LoopSettings& settings);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Add rows[from..] in order while each one's prompt K/V slot fits the pool (admission by memory); returns how many
  // were added: the rest wait for a later call, when finished rows have given their slots back.
  size_t add(const std::vector<Row*>& rows, size_t from = 0);
  int64_t slot_positions(const Row& row) const;  // its prefix, less its last position under shifted logits
  void remove(Row* row);  // for good: its slot back to the pool, its call-buffer entries freed
  void retire();          // remove the rows with no step left
  void close();           // remove every row and give the call buffers back
  bool step();            // advance every live row once; false, doing nothing, when no row is live
  const std::vector<Row*>& rows() const { return rows_; }

 private:
  struct Call;
  struct Window;
  bool reserve(Row& row);
  void predict(const std::vector<Row*>& rows, Window& window);
  void commit(const std::vector<Row*>& rows, const Window& window);
  Call& memo(const std::vector<int64_t>& key, const std::function<Layout()>& make);
  GraphCall bind(const std::string& graph, Call& call, const std::vector<Row*>& members);
  void run(Call& call, const std::vector<Row*>& members, const std::vector<int64_t>& at, int64_t width);
  int64_t prompt_calls(const std::string& graph, const std::vector<Row*>& rows, const std::vector<int64_t>& idx,
                       int64_t width);
  int64_t cached_calls(const std::string& graph, const std::vector<Row*>& rows, const std::vector<int64_t>& idx,
                       const std::vector<float>& weights, int64_t width);

  LoopSettings s_;
  int64_t mask_;
  size_t row_bytes_;                       // one embedding row in the graphs' precision
  ConfidenceOutput confidence_;            // the window graph's log-probability output
  std::optional<KVGeometry> geometry_;
  std::unique_ptr<CallBuffers> buffers_;
  std::vector<Row*> rows_;
  std::list<std::pair<std::vector<int64_t>, std::unique_ptr<Call>>> calls_;  // least recently used first
  std::map<std::vector<int64_t>, decltype(calls_)::iterator> by_key_;
  size_t layout_bytes_ = 0;
  std::vector<int64_t> x0_;   // [n, width] a step's predictions
  std::vector<double> conf_;  // [n, width] their log-probabilities (or scores), -inf where none
};

}  // namespace seer
