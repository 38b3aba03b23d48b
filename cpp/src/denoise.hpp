// The one denoising loop, greedy, for any group of rows in any layout (seer_trt/runtime/denoise.py, docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").
//
// In:  a group's Layout, its rows' Schedule, the backend's denoise graph; optionally step 0's prediction from a
//      full-depth step-zero pass; optionally the early-stop id.
// Out: the answer tokens [n, L_max] and the steps each row took part in.
// Per step (LLaDA-V generate_with_embeds): the graph predicts x0 and its confidence at every position (special
// ids suppressed in the graph); positions past the row's block are not eligible; each row commits its transfer[t]
// most confident eligible positions (ties to the earlier position). With early stopping a row that has
// committed <|eot_id|> commits only before its first one and is done when nothing before it is masked. The
// buffers of a group are allocated once; a step rewrites gen_ids in place and calls the graph. With a prompt
// K/V cache (kv_cache.hpp) a step either computes the prompt (a refresh) or only the answer positions against
// the cached prompt K/V; the policy decides per step, the loop is the same.
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

struct StepZeroPrediction {
  const int64_t* x0;        // [rows, stride] step 0's greedy ids of each group row
  const float* confidence;  // [rows, stride]
  int64_t stride;           // N
};

struct Denoised {
  std::vector<int64_t> tokens;  // [n, width]
  std::vector<int64_t> steps;   // [n]
  std::vector<int64_t> refreshes;  // [n] of those steps, the graph calls that computed the row's prompt
  int64_t width = 0;
};

Denoised denoise(Backend& backend, const Manifest& manifest, Layout& layout, const Schedule& schedule,
                 const std::vector<int64_t>& rows, const std::optional<StepZeroPrediction>& step0,
                 std::optional<int64_t> stop_id, std::atomic<int64_t>* clock, const CacheSpec& cache_spec,
                 const CacheConfig& cache = {});

}  // namespace seer
