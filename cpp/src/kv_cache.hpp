// Prompt K/V cache policies of the denoising loop: when to compute the prompt, what to feed between (seer_trt/runtime/kv_cache.py, docs/DESIGN.md "Graphs and their contract", "Prompt K/V cache").
//
// In:  per row a CacheConfig (none | reuse | forecast, refresh interval R, forecast order); the window graph's cache
//      contract (CacheSpec, read from the manifest: manifest schema 2.1); a byte budget.
// Out: RowCache: per row and step, whether the step computes the row's prompt (a refresh) or which snapshots it
//      reads with which weights. KVPool: each row's snapshots in a slot, within the budget (a request is admitted
//      when its slot fits). CallBuffers: a loop's buffers for its calls: a refresh's present.* are written there by
//      the graph (bound as its outputs) and copied into the rows' slots; a cached step's past_key_values.* are
//      bound to them, and only entries whose row or snapshot changed since the buffer's last call are copied.
//
//     none      every step computes the prompt (history 1, past 0, weight 1): the exact loop
//     reuse     refresh at the row's step 0, every R steps and at its every block boundary; in between feed its last
//               snapshot
//     forecast  the same refreshes; in between feed the last order + 1 snapshots with the barycentric Lagrange
//               weights of ResilPhase's tanh phase map (the graph combines them: only the weights change per step)
//
// Where the K/V live (host memory under the CPU provider; every copy goes through copy_columns, the one function a
// device build would replace with its own copy):
//
//     refresh call ─► present.* into the loop's present buffer [layers, 2, B, H_kv, P, hd]
//                     ─► each row's columns copied into its slot [snapshots, layers, 2, H_kv, C_i, hd]
//     cached call  ◄─ past_key_values.* from the loop's past buffer [layers, 2, M, entries, H_kv, past, hd]:
//                     entry b holds a row's snapshot right-aligned, copied from its slot only when its row or
//                     snapshot changed
//
// Shifted logits (Dream, manifest model.logit_shift 1): a row's first answer position is predicted from its last
// prompt position's state, which no cache holds; a cached step computes that position with the answer, and the
// slot holds the other prefix positions.
//
// A 2.0 export (no past_weights input) runs with cache none only. The drift gate of seer_trt.runtime.kv_cache (a
// Python-API option, not a seer-run flag) is not ported.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"

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

// The window graph's K/V geometry, from its contract.
struct KVGeometry {
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  std::string dtype;
  size_t itemsize = 0;
  static KVGeometry of(const CacheSpec& spec, const std::string& dtype);
  size_t column_bytes() const { return static_cast<size_t>(head_dim) * itemsize; }  // one position of one head
  // bytes of one prompt position's keys and values over every layer (one snapshot)
  size_t position_bytes() const { return 2 * static_cast<size_t>(layers * kv_heads) * column_bytes(); }
};

// Columns (axis -2) src_col .. src_col + count of src [lead, src_cols, column] into dst [lead, dst_cols, column] from
// dst_col: every K/V copy of the loop (DeviceMemory.copy_columns). Host memory here (the CPU provider's); a device
// build puts its device-to-device copy in this one place.
void copy_columns(uint8_t* dst, int64_t dst_cols, int64_t dst_col, const uint8_t* src, int64_t src_cols,
                  int64_t src_col, int64_t count, int64_t lead, size_t column_bytes);

// One row's snapshots in the pool: [snapshots, layers, 2 (key, value), H_kv, positions, head_dim].
struct Slot {
  std::vector<uint8_t> data;
  int64_t positions = 0;  // prompt positions it holds (the row's prefix, less its last one when logits are shifted)
  size_t nbytes = 0;
  int64_t id = 0;
  std::vector<int64_t> versions;  // per snapshot, bumped at each store: what a call buffer's entry is compared with
  size_t offset(const KVGeometry& g, int64_t index, int64_t layer, int64_t kv) const {  // of [H_kv, positions, hd]
    return (((index * g.layers + layer) * 2 + kv) * g.kv_heads * positions) * g.column_bytes();
  }
};

// Rows' prompt K/V snapshots in slots within a byte budget; thread-safe (the loops of several generate calls share
// one pool). The loops' call buffers are counted apart (buffer_bytes): a loop holds a bounded few.
class KVPool {
 public:
  KVPool(const KVGeometry& geometry, int64_t budget);
  const KVGeometry& geometry() const { return geometry_; }
  int64_t budget() const { return budget_; }
  int64_t used() const;          // bytes the slots hold
  int64_t buffer_bytes() const;  // bytes the loops' call buffers hold
  size_t slot_bytes(int64_t positions, int64_t snapshots) const;
  // A slot of `snapshots` x `positions` positions, or none when it does not fit the budget now
  std::unique_ptr<Slot> reserve(int64_t positions, int64_t snapshots);
  void release(std::unique_ptr<Slot>& slot);
  void claim(size_t nbytes);  // a call buffer's bytes (counted apart from the budget, never refused)
  void unclaim(size_t nbytes);
  void release_bytes(size_t nbytes, int64_t slots = 0);
  // Snapshot `index` of `slot` from a refresh's present buffer [layers, 2, batch, H_kv, prompt, hd]: batch entry
  // `entry`, slot.positions columns from `column`
  void store(Slot& slot, int64_t index, const uint8_t* present, int64_t batch, int64_t prompt, int64_t entry,
             int64_t column);

 private:
  KVGeometry geometry_;
  int64_t budget_;
  mutable std::mutex mutex_;
  int64_t used_ = 0, slots_ = 0, buffers_ = 0, next_id_ = 1;
};

// One row's cache policy over its steps: when it refreshes, which snapshots it holds (their steps and where they lie
// in its slot).
class RowCache {
 public:
  explicit RowCache(const CacheConfig& config) : config(config) {}
  bool stores() const { return config.mode != "none"; }  // a step that computes the prompt keeps its K/V
  // none when step t computes the row's prompt (boundary: its block changes), else the weights [M] of the snapshots
  // it reads (fed), oldest first
  std::optional<std::vector<float>> plan(int64_t t, bool boundary) const;
  std::vector<int64_t> fed(size_t history) const;  // the slot's snapshot indices read, in the weights' order
  int64_t target() const;  // the snapshot the next refresh writes: a free one, else the oldest held
  void stored(int64_t t, int64_t index);  // after a refresh at step t wrote snapshot `index`

  CacheConfig config;
  std::unique_ptr<Slot> slot;  // its snapshots in the pool (none under policy none)

 private:
  std::vector<int64_t> steps_;  // refresh step of each snapshot held, oldest first
  std::vector<int64_t> held_;   // the slot's snapshot index of each, oldest first
  int64_t next_refresh_ = 0;
};

// One loop's buffers for its calls (KVPool counts their bytes): the past K/V of cached calls, by history M, past
// length and the call's place among the step's calls of that shape, and the present K/V a refresh writes, by batch
// and prompt length. A buffer's id changes only when it is made anew, so a call bound to it knows when to bind again.
class CallBuffers {
 public:
  static constexpr size_t PRESENT_KEPT = 4;  // present buffers kept, least recently used out
  using Handle = std::array<int64_t, 4>;     // (history, past, entries, k): the k-th buffer of that shape
  struct Buffer {
    std::vector<uint8_t> data;
    uint64_t id = 0;
  };
  struct Past {
    Buffer buffer;                 // [layers, 2, M, entries, H_kv, past, hd]
    int64_t history = 0, entries = 0, past = 0;
    std::vector<int64_t> rows;     // the row key each entry holds (0: none)
    std::map<std::pair<int64_t, int64_t>, std::array<int64_t, 3>> tags;  // (m, entry) -> (slot id, snapshot, version)
  };
  struct PastRow {
    int64_t key;
    const Slot* slot;
    std::vector<int64_t> fed;  // the snapshot indices it reads, oldest first
  };

  // capacity: the most rows one cached call holds (the largest batch bucket): a reuse call's buffer has that many
  // entries and a call binds its first B, so rows keep their entries as others come and go.
  CallBuffers(KVPool& pool, int64_t capacity) : pool_(pool), capacity_(capacity) {}
  ~CallBuffers() { close(); }
  CallBuffers(const CallBuffers&) = delete;
  CallBuffers& operator=(const CallBuffers&) = delete;
  // Where a refresh call of `batch` rows x `prompt` columns writes its present.* ([layers, 2, batch, H, prompt, hd])
  Buffer& present_into(int64_t batch, int64_t prompt);
  void begin_step();  // a new step: its cached calls take the past buffers again from the first of each shape
  // The buffer a cached call of rows `keys` (history snapshots, past columns) reads, and the order its rows take its
  // entries in (indices into keys): rows already in the buffer keep their entry where it lies among the first
  // keys.size(), the others fill the free entries. The k-th call of a step with this shape takes the k-th buffer.
  std::pair<Handle, std::vector<int64_t>> past_call(const std::vector<int64_t>& keys, int64_t history, int64_t past);
  // The buffer of the cached call `handle` whose entries hold `rows` in order; copies only the entries whose content
  // changed.
  Past& past_feeds(const Handle& handle, const std::vector<PastRow>& rows);
  void forget(int64_t row);  // a row left the loop: its entries are free
  void close();              // every buffer's bytes back to the pool

 private:
  Buffer alloc(size_t nbytes);

  KVPool& pool_;
  int64_t capacity_;
  uint64_t next_id_ = 1;
  std::map<Handle, Past> past_;
  std::map<std::array<int64_t, 3>, int64_t> taken_;  // this step's cached calls so far, per shape
  std::list<std::pair<std::pair<int64_t, int64_t>, Buffer>> present_;  // least recently used first
};

// The cache inputs and outputs of one window call: a call that computes the prompt (an empty cache in; present.*
// into `present` when some row stores its K/V) or a cached call (past_weights and the past buffer's first B entries).
// `weights` must outlive the call.
void bind_present(GraphCall& call, const CacheSpec& spec, const KVGeometry& g, uint8_t* present, int64_t batch,
                  int64_t prompt);
void bind_past(GraphCall& call, const CacheSpec& spec, const KVGeometry& g, CallBuffers::Past& past, int64_t batch,
               std::vector<float>& weights);

}  // namespace seer
