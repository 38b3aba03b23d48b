// Dispatch: group a batch's rows by their truncated length and choose how each group runs (seer_trt/runtime/dispatch.py,
// docs/DESIGN.md "Seer, exactly" hybrid execution).
//
// In:  per row the prompt length P_i, kept window L_i and steps; the length buckets; a policy (and for
//      cost_model the fitted CostModel).
// Out: DispatchPlan: groups of rows, each with its path (static / packed / eager) and its call's shape.
// Policies as in Python: cost_model (the default: the plan its cost model predicts fastest, per-request
// execution unless the predicted gain exceeds the model's own error), hybrid (the paper's rule, prompt padding
// counted), and for comparison naive_pad, static, packed, per_request. Whatever the plan, every row computes
// the same values; only the time changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace seer {

extern const char* const POLICIES[6];

struct Group {
  std::vector<int64_t> rows;  // indices into the batch
  std::string path;           // static | packed | eager
  int64_t prompt_len = 0;     // p of the call: the bucket (static), the longest (eager, naive), the sum (packed)
  int64_t gen_len = 0;        // g of the call, the same way
  int64_t batch = 0;          // b of the call: rows, or 1 when packed
  int64_t steps = 0;          // the group's longest row's
  double rho = 0;             // padding share of the group's static call at its buckets, prompt included
};

// Seconds of one denoising step over b rows x s slots: c0 + c1 * b * s + c2 * b * s^2.
struct CostModel {
  double c0 = 0, c1 = 0, c2 = 0;
  double error = 0;  // RMS relative error of the fit on its own measurements
  double operator()(int64_t b, int64_t s) const { return c0 + c1 * b * s + c2 * double(b) * s * s; }
  double seconds(const Group& g) const { return g.steps * (*this)(g.batch, g.prompt_len + g.gen_len); }
  // Non-negative least squares of the relative error over (b, s) -> seconds, every subset of the three terms.
  static CostModel fit(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<double>& seconds);
};

struct DispatchPlan {
  std::string policy;
  std::vector<Group> groups;
};

void check_policy(const std::string& policy);  // throws config_error
DispatchPlan plan_dispatch(const std::vector<int64_t>& prompts, const std::vector<int64_t>& kept,
                           const std::vector<int64_t>& steps, const Buckets& buckets, const std::string& policy,
                           double tau_pad, int64_t short_rows, const CostModel* cost);

}  // namespace seer
