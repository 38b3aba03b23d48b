// Answer-boundary detection at step zero (seer_trt/runtime/boundary.py, docs/DESIGN.md "Seer, exactly": the paper's SNR criterion).
//
// In:  a step-zero profile [B, N] (an MLP statistic, a probe's probability, or an end-token probability) and
//      the calibration's detector.
// Out: kept lengths L* [B], N where no boundary is found.
#pragma once

#include <cstdint>
#include <vector>

#include "manifest.hpp"

namespace seer {

// The SNR rule: first i in 1..N-window with jump = min(s[i..i+window)) - s[i-1] >= tau_jump and
// max - min <= gamma * jump; L* = min(N, i + 1 + margin). direction "down" negates the profile.
std::vector<int64_t> find_boundaries(const std::vector<double>& profile, int64_t batch, int64_t n,
                                     const SeerConfig& seer);
// The threshold rule: the smallest i from which every score exceeds threshold; L* = min(N, i + 1 + margin).
std::vector<int64_t> find_end_by_probability(const std::vector<double>& profile, int64_t batch, int64_t n,
                                             const SeerConfig& seer);
// L* [B] with the calibration's detector; throws Error (Runtime) on NaN or inf in the profile.
std::vector<int64_t> detect(const std::vector<double>& profile, int64_t batch, int64_t n, const SeerConfig& seer);

}  // namespace seer
