// Dispatch: split rows into graph calls by their lengths and choose how each call runs (seer_trt/runtime/dispatch.py,
// docs/DESIGN.md "Seer, exactly" hybrid execution, "Serving and embedding").
//
// In:  per row the prompt length P_i, kept window L_i and steps (the loop plans one step: ones); the length buckets;
//      a policy (and for cost_model the fitted CostModel). For a cached step: each row's past (its K/V's positions).
// Out: DispatchPlan: groups of rows, each with its path (static / packed / eager) and its call's shape;
//      plan_cached: the cached calls of one step.
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
  int64_t past_len = 0;       // a cached step's past axis: its rows' prompt K/V, right-aligned (0: none)
};

// Seconds of one denoising step over b rows x s slots attending to `keys` slots each (s, unless a cached step also
// reads a past): c0 + c1 * b * s + c2 * b * s * keys.
struct CostModel {
  double c0 = 0, c1 = 0, c2 = 0;
  double error = 0;  // RMS relative error of the fit on its own measurements
  double operator()(int64_t b, int64_t s, int64_t keys = -1) const {
    return c0 + c1 * b * s + c2 * double(b) * s * (keys < 0 ? s : keys);
  }
  double seconds(const Group& g) const {
    const int64_t seq = g.prompt_len + g.gen_len;
    return g.steps * (*this)(g.batch, seq, seq + g.past_len);
  }
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
// One step's cached calls over rows reading their prompt K/V (seer_trt.runtime.dispatch.plan_cached): each row's
// answer (and `live` = 1 prompt position of a shifted model) against its K/V, right-aligned in a past axis padded to
// the prompt bucket of its longest row. Never packed. past: [n] positions each row's K/V holds; kept: [n].
std::vector<Group> plan_cached(const std::vector<int64_t>& past, const std::vector<int64_t>& kept, int64_t live,
                               const Buckets& buckets, const std::string& policy, const CostModel* cost);

}  // namespace seer
