// Prompt K/V cache policies of the denoising loop (seer_trt/runtime/kv_cache.py, docs/DESIGN.md "Graphs and their contract", "Prompt K/V cache").
//
// In:  a CacheConfig (none | reuse | forecast, refresh interval R, forecast order), the window graph's cache
//      contract (CacheSpec, read from the manifest: manifest schema 2.1), one group's Layout.
// Out: GroupCache: per step the graph call to run (one that computes the prompt, or a cached step over the
//      kept snapshots) and whether it is a refresh; after a refresh it keeps that call's present.{i}.key/value.
//
//     none      every step computes the prompt (history 1, past 0, weight 1): the exact loop
//     reuse     refresh at step 0, every R steps and at every block boundary; in between feed the last snapshot
//     forecast  the same refreshes; in between feed the last order + 1 snapshots with the barycentric Lagrange
//               weights of ResilPhase's tanh phase map (the graph combines them: only the weights change per step)
//
// Shifted logits (Dream, manifest model.logit_shift 1): a row's first answer position is predicted from its last
// prompt position's state, which no cache holds; a cached step computes those positions (live_columns) with the
// answer, and the snapshots hold the other prompt positions (seer_trt/runtime/kv_cache.py).
//
// A 2.0 export (no past_weights input) runs with cache none only. The drift gate of seer_trt.runtime.kv_cache (a
// Python-API option, not a seer-run flag) is not ported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend.hpp"
#include "layout.hpp"

namespace seer {

constexpr double RESILPHASE_ALPHA = 0.55;  // steepness of the tanh phase map (seer_trt.contracts.policies.CacheConfig.alpha)

struct CacheConfig {  // the defaults are the exact loop's; seer::Options holds the pipeline's default policy
  std::string mode = "none";  // none | reuse | forecast
  int64_t refresh = 8;        // R: steps from one prompt computation to the next (and one at every block start)
  int64_t order = 1;          // forecast: Lagrange order (snapshots kept: order + 1)
  void validate() const;      // throws config_error
  int64_t snapshots() const { return mode == "forecast" ? order + 1 : 1; }
  bool operator==(const CacheConfig& o) const { return mode == o.mode && refresh == o.refresh && order == o.order; }
};

// The window graph's cache inputs and outputs (seer_trt/contracts/graphs.py cache_specs): none in a 2.0 export.
struct CacheSpec {
  bool enabled = false;  // the graph takes past_weights (manifest schema 2.1)
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  std::vector<std::string> past, present;  // past_key_values.{i}.key/value, present.{i}.key/value: by layer, key first
};

// The cache contract of a window graph's manifest entry, after its four window inputs; throws manifest_error for
// cache I/O in another order or shape than seer_trt.contracts.graphs.cache_specs writes.
CacheSpec cache_spec(const GraphEntry& window);

// A policy other than none on a window graph without cache inputs (a 2.0 export): config_error with the fix.
void check_cache(const CacheConfig& config, const CacheSpec& spec);

// [M] weights of the snapshots taken at `steps` (oldest first) for the K/V at step t
// (seer_trt.runtime.kv_cache.forecast_weights: float64 arithmetic as numpy's, rounded to float32 at the end).
std::vector<float> forecast_weights(const std::vector<int64_t>& steps, int64_t t, double alpha);

// The inputs of a call without a cache (history 1, past 0, weight 1), for `batch` rows; nothing without a cache.
// It must outlive the call (it holds the weight 1 and a non-null address for the empty tensors).
struct NoCache {
  float one = 1.0f;
  uint64_t empty = 0;
  void bind(GraphCall& call, const CacheSpec& spec, const std::string& dtype, int64_t batch);
};

class GroupCache {
 public:
  GroupCache(const CacheConfig& config, const CacheSpec& spec, const std::string& dtype, const Layout& layout,
             bool shifted = false);
  // Shifted logits: the prompt columns a cached step computes (some row's last prompt position), ascending; and the
  // call's column order then: the cached columns, the live ones, the answer. Empty when not shifted.
  const std::vector<int64_t>& live_columns() const { return live_; }
  const std::vector<int64_t>& call_order() const { return order_; }
  // The cache inputs of a call that computes the prompt (and, when the policy keeps snapshots, its present
  // outputs, into this cache's buffers).
  void bind_refresh(GraphCall& call);
  // Whether step t (boundary: a block starts there) computes the prompt; if not, bind_past feeds its cache.
  bool refresh_due(int64_t t, bool boundary) const;
  void bind_past(GraphCall& call, int64_t t);  // past_weights and past_key_values of a cached step t
  void store(int64_t t);                       // after a refresh at step t: its present K/V become the newest snapshot
  // The group was re-formed to batch entries `entries` (ascending): every snapshot keeps only theirs; bind the
  // refresh call again (bind_refresh) for the smaller batch.
  void select(const std::vector<int64_t>& entries);

 private:
  CacheConfig config_;
  const CacheSpec& spec_;  // the pipeline's: its names outlive every call
  std::string dtype_;
  int64_t batch_, prompt_;
  int64_t cached_;                             // prompt positions a snapshot holds: P, or P minus the live ones
  std::vector<int64_t> kept_, live_, order_;   // shifted: cached and live prompt columns, the call's column order
  NoCache none_;
  size_t slot_bytes_ = 0;                      // one snapshot of one layer's key (or value): [b, H_kv, cached, hd]
  size_t fresh_bytes_ = 0;                     // the refresh's present output of one layer: [b, H_kv, P, hd]
  std::vector<std::vector<uint8_t>> fresh_;    // per layer key, value: the refresh call's present output
  std::vector<std::vector<uint8_t>> history_;  // per layer key, value: [keep, b, H_kv, P, hd], oldest first
  std::vector<int64_t> steps_;                 // refresh step of each kept snapshot
  std::vector<float> weights_;                 // past_weights of the cached call
  int64_t next_refresh_ = 0;
};

}  // namespace seer
