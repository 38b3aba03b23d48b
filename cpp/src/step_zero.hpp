// Stage 2, step zero: the Seer signal of every answer position while the window is all masks
// (seer_trt/runtime/step_zero.py, docs/DESIGN.md "Seer, exactly").
//
// In:  the rows' prompt embeddings, the window N, the calibration.
// Out: the profile [B, N] the boundary rule reads; at full depth (end_token_prob) also step 0's x0 and its
//      log-probability [B, N] (a 2.1 export's confidence logged), which the denoising loop reuses as its step 0.
// An MLP statistic or a probe runs the early-exit step_zero graph (layers 0..k); the end-token signal runs the
// one window graph denoise (with an empty prompt K/V cache where it takes one). Rows go in calls of at most the
// largest batch bucket, left-padded to the longest.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "kv_cache.hpp"
#include "layout.hpp"

namespace seer {

struct StepZeroOut {
  std::vector<double> profile;  // [B, N]
  std::vector<int64_t> x0;      // [B, N], full depth only
  std::vector<float> confidence;  // [B, N] log-probability of x0, full depth only
};

StepZeroOut run_step_zero(Backend& backend, const Manifest& manifest, const std::vector<Prompt>& prompts, int64_t n,
                          std::atomic<int64_t>* clock, const CacheSpec& cache_spec);

}  // namespace seer
