// The one denoising loop, greedy, for any group of rows in any layout (seer_trt/runtime/denoise.py, docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly", "Decoding strategies").
//
// In:  a group's Layout, its rows' Schedule, the backend's denoise graph, the loop's settings (decoding rule, early
//      stop id, prompt K/V cache policy); optionally step 0's prediction from a full-depth step-zero pass.
// Out: the answer tokens [n, L_max] and the steps each row took part in.
// Per step (LLaDA-V generate_with_embeds): the graph predicts x0 and its log-probability at every position (special
// ids suppressed in the graph; a 2.1 export's probability is logged here, as numpy does), or a Dream score it returns;
// positions past the row's block are not eligible; then the request's rule commits (decoding.hpp: fixed, threshold:τ,
// factor:f), comparing float64 log-probabilities.
//
// Under fixed the block comes from the schedule; under threshold and factor a row's block is the one of its first
// position still to commit, and a row may take as many steps as its window has positions. With early stopping a
// row that has committed <|eot_id|> commits only before its first one and is done when nothing before it is
// masked. The buffers of a group are allocated once; a step rewrites gen_ids in place and calls the graph. Once
// rows are done the group is re-formed from the live rows' batch entries when that pays (the cost model's
// prediction beats its own error, or without one at most half the entries are live); a row computes the same
// values whatever shares its call, so no token changes. With a prompt K/V cache (kv_cache.hpp) a step either
// computes the prompt (a refresh) or only the answer positions against the cached prompt K/V; the policy decides
// per step, the loop is the same.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "backend.hpp"
#include "kv_cache.hpp"
#include "layout.hpp"
#include "schedule.hpp"

namespace seer {

struct CostModel;

struct StepZeroPrediction {
  const int64_t* x0;        // [rows, stride] step 0's greedy ids of each group row
  const float* confidence;  // [rows, stride] their log-probabilities
  int64_t stride;           // N
};

struct LoopSettings {
  DecodingRule rule;                // fixed | threshold | factor (Decoding::rule, decoding.hpp)
  int64_t block_length = 0;         // the blocks of threshold and factor (0: one block per window)
  std::optional<int64_t> stop_id;   // early stopping at this id (<|eot_id|>); none: until the windows are committed
  CacheConfig cache;                // the prompt K/V cache policy (none: every step computes the prompt)
  const CostModel* cost = nullptr;  // decides when the group is re-formed from its live rows (none: at half)
  std::string score;                // the denoise output the loop ranks by (Decoding::score): "" the
                                    // log-probability; Dream's log_margin or neg_entropy
};

struct Denoised {
  std::vector<int64_t> tokens;  // [n, width]
  std::vector<int64_t> steps;   // [n]
  std::vector<int64_t> refreshes;  // [n] of those steps, the graph calls that computed the row's prompt
  int64_t width = 0;
};

Denoised denoise(Backend& backend, const Manifest& manifest, Layout& layout, const Schedule& schedule,
                 const std::vector<int64_t>& rows, const std::optional<StepZeroPrediction>& step0,
                 const LoopSettings& loop, std::atomic<int64_t>* clock, const CacheSpec& cache_spec);

}  // namespace seer
