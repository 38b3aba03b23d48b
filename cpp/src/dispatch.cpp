#include "dispatch.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

namespace seer {

const char* const POLICIES[6] = {"cost_model", "hybrid", "naive_pad", "static", "packed", "per_request"};

namespace {

int64_t bucket(int64_t value, const std::vector<int64_t>& sizes) {
  for (int64_t s : sizes)
    if (s >= value) return s;
  return value;
}

struct Rows {
  const std::vector<int64_t>& prompts;
  const std::vector<int64_t>& kept;
  const std::vector<int64_t>& steps;
  const Buckets& buckets;

  Group group(const std::vector<int64_t>& rows, const std::string& path, bool bucketed = true) const {
    int64_t max_p = 0, max_g = 0, sum_p = 0, sum_g = 0, max_t = 0;
    for (int64_t r : rows) {
      max_p = std::max(max_p, prompts[r]), max_g = std::max(max_g, kept[r]), max_t = std::max(max_t, steps[r]);
      sum_p += prompts[r], sum_g += kept[r];
    }
    Group g{rows, path, max_p, max_g, static_cast<int64_t>(rows.size()), max_t, 0};
    if (path == "packed") g.prompt_len = sum_p, g.gen_len = sum_g, g.batch = 1;
    else if (path == "static" && bucketed)
      g.prompt_len = bucket(max_p, buckets.prompt), g.gen_len = bucket(max_g, buckets.answer);
    const double static_slots = double(rows.size()) * (bucket(max_p, buckets.prompt) + bucket(max_g, buckets.answer));
    g.rho = 1.0 - double(sum_p + sum_g) / static_slots;
    return g;
  }
};

// Rows grouped by answer bucket (shortest first), at most max_batch per group, in row order.
std::vector<std::vector<int64_t>> by_bucket(const std::vector<int64_t>& rows, const Rows& ctx, int64_t max_batch) {
  std::vector<int64_t> keys;
  for (int64_t r : rows) keys.push_back(bucket(ctx.kept[r], ctx.buckets.answer));
  std::vector<int64_t> distinct = keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<std::vector<int64_t>> groups;
  for (int64_t key : distinct) {
    std::vector<int64_t> members;
    for (size_t i = 0; i < rows.size(); ++i)
      if (keys[i] == key) members.push_back(rows[i]);
    for (size_t i = 0; i < members.size(); i += max_batch)
      groups.emplace_back(members.begin() + i, members.begin() + std::min(members.size(), i + max_batch));
  }
  return groups;
}

std::vector<Group> fixed_groups(const std::string& policy, const Rows& ctx, double tau_pad, int64_t short_rows) {
  const int64_t n = static_cast<int64_t>(ctx.kept.size());
  const int64_t max_batch = ctx.buckets.batch.back();
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::vector<Group> groups;
  if (policy == "naive_pad") {
    for (int64_t i = 0; i < n; i += max_batch)
      groups.push_back(ctx.group({all.begin() + i, all.begin() + std::min(n, i + max_batch)}, "static", false));
  } else if (policy == "per_request") {
    for (int64_t r : all) groups.push_back(ctx.group({r}, "eager"));
  } else if (policy == "static" || policy == "packed") {
    for (const auto& rows : by_bucket(all, ctx, max_batch)) groups.push_back(ctx.group(rows, policy));
  } else {  // hybrid: short rows apart; per bucket group static when rho <= tau_pad, packed otherwise
    std::vector<int64_t> shorter, longer;
    for (int64_t r : all) (ctx.kept[r] <= short_rows ? shorter : longer).push_back(r);
    for (const auto* part : {&shorter, &longer})
      for (const auto& rows : by_bucket(*part, ctx, max_batch)) {
        if (rows.size() == 1) {
          groups.push_back(ctx.group(rows, "eager"));
          continue;
        }
        Group g = ctx.group(rows, "static");
        groups.push_back(g.rho <= tau_pad ? g : ctx.group(rows, "packed"));
      }
  }
  return groups;
}

// The split of `order` into runs of consecutive rows (at most a batch bucket each) of least predicted time,
// each run on its cheapest path: dynamic programming over the split points.
std::vector<Group> search_groups(const std::vector<int64_t>& order, const Rows& ctx, const CostModel& cost) {
  const int64_t n = static_cast<int64_t>(order.size()), cap = ctx.buckets.batch.back();
  std::vector<double> best(n + 1, std::numeric_limits<double>::infinity());
  std::vector<std::pair<int64_t, std::string>> choice(n + 1, {0, "eager"});
  best[0] = 0;
  for (int64_t j = 1; j <= n; ++j) {
    int64_t max_p = 0, max_g = 0, max_t = 0, sum_p = 0, sum_g = 0;
    for (int64_t i = j - 1; i > std::max<int64_t>(-1, j - 1 - cap); --i) {
      const int64_t r = order[i];
      max_p = std::max(max_p, ctx.prompts[r]), max_g = std::max(max_g, ctx.kept[r]);
      max_t = std::max(max_t, ctx.steps[r]), sum_p += ctx.prompts[r], sum_g += ctx.kept[r];
      const int64_t size = j - i;
      std::string path = size == 1 ? "eager" : "static";
      double seconds = max_t * cost(size, max_p + max_g);
      if (size > 1 && max_t * cost(1, sum_p + sum_g) < seconds) path = "packed", seconds = max_t * cost(1, sum_p + sum_g);
      if (best[i] + seconds < best[j]) best[j] = best[i] + seconds, choice[j] = {i, path};
    }
  }
  std::vector<Group> groups;
  for (int64_t j = n; j > 0;) {
    const auto& [i, path] = choice[j];
    std::vector<int64_t> rows(order.begin() + i, order.begin() + j);
    std::sort(rows.begin(), rows.end());
    groups.push_back(ctx.group(rows, path, false));
    j = i;
  }
  std::reverse(groups.begin(), groups.end());
  return groups;
}

double total(const std::vector<Group>& groups, const CostModel& cost) {
  double s = 0;
  for (const auto& g : groups) s += cost.seconds(g);
  return s;
}

// Solve min ||A x - 1|| for the columns `cols` of A (rows scaled by 1 / t): normal equations on unit-norm columns.
bool least_squares(const std::vector<std::array<double, 3>>& a, const std::vector<int>& cols, std::array<double, 3>& x) {
  const size_t k = cols.size();
  double norm[3] = {0, 0, 0}, m[3][4] = {};
  for (size_t c = 0; c < k; ++c) {
    for (const auto& row : a) norm[c] += row[cols[c]] * row[cols[c]];
    norm[c] = std::sqrt(norm[c]);
    if (norm[c] == 0) return false;
  }
  for (size_t r = 0; r < k; ++r) {
    for (size_t c = 0; c < k; ++c)
      for (const auto& row : a) m[r][c] += row[cols[r]] / norm[r] * row[cols[c]] / norm[c];
    for (const auto& row : a) m[r][k] += row[cols[r]] / norm[r];
  }
  for (size_t p = 0; p < k; ++p) {  // Gaussian elimination with partial pivoting
    size_t pivot = p;
    for (size_t r = p + 1; r < k; ++r)
      if (std::abs(m[r][p]) > std::abs(m[pivot][p])) pivot = r;
    std::swap(m[p], m[pivot]);
    if (std::abs(m[p][p]) < 1e-300) return false;
    for (size_t r = 0; r < k; ++r)
      if (r != p) {
        const double f = m[r][p] / m[p][p];
        for (size_t c = p; c <= k; ++c) m[r][c] -= f * m[p][c];
      }
  }
  x = {0, 0, 0};
  for (size_t c = 0; c < k; ++c) x[cols[c]] = m[c][k] / m[c][c] / norm[c];
  return true;
}

}  // namespace

CostModel CostModel::fit(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<double>& seconds) {
  std::vector<std::array<double, 3>> a;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const double b = double(shapes[i].first), s = double(shapes[i].second);
    a.push_back({1.0 / seconds[i], b * s / seconds[i], b * s * s / seconds[i]});
  }
  const std::vector<std::vector<int>> subsets = {{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  CostModel best;
  double best_err = std::numeric_limits<double>::infinity();
  for (const auto& cols : subsets) {
    std::array<double, 3> x{};
    if (!least_squares(a, cols, x) || x[0] < 0 || x[1] < 0 || x[2] < 0) continue;
    double err = 0;
    for (const auto& row : a) err += std::pow(row[0] * x[0] + row[1] * x[1] + row[2] * x[2] - 1.0, 2);
    if (err < best_err) best = {x[0], x[1], x[2], 0}, best_err = err;
  }
  best.error = std::sqrt(best_err / double(a.size()));
  return best;
}

void check_policy(const std::string& policy) {
  if (std::find(std::begin(POLICIES), std::end(POLICIES), policy) == std::end(POLICIES))
    throw config_error("unknown dispatch policy '" + policy +
                       "'; choose from cost_model, hybrid, naive_pad, static, packed, per_request");
}

DispatchPlan plan_dispatch(const std::vector<int64_t>& prompts, const std::vector<int64_t>& kept,
                           const std::vector<int64_t>& steps, const Buckets& buckets, const std::string& policy,
                           double tau_pad, int64_t short_rows, const CostModel* cost) {
  check_policy(policy);
  const Rows ctx{prompts, kept, steps, buckets};
  if (policy != "cost_model") return {policy, fixed_groups(policy, ctx, tau_pad, short_rows)};
  if (kept.size() <= 1 || cost == nullptr) return {policy, fixed_groups("per_request", ctx, tau_pad, short_rows)};
  // two orders of the rows: by steps (then kept, prompt), by prompt (then steps, kept); ties by row
  std::vector<int64_t> by_steps(kept.size()), by_prompt(kept.size());
  std::iota(by_steps.begin(), by_steps.end(), 0);
  std::iota(by_prompt.begin(), by_prompt.end(), 0);
  std::stable_sort(by_steps.begin(), by_steps.end(), [&](int64_t a, int64_t b) {
    return std::tie(steps[a], kept[a], prompts[a]) < std::tie(steps[b], kept[b], prompts[b]);
  });
  std::stable_sort(by_prompt.begin(), by_prompt.end(), [&](int64_t a, int64_t b) {
    return std::tie(prompts[a], steps[a], kept[a]) < std::tie(prompts[b], steps[b], kept[b]);
  });
  std::vector<std::vector<Group>> plans = {search_groups(by_steps, ctx, *cost), search_groups(by_prompt, ctx, *cost)};
  for (const char* p : POLICIES)
    if (std::string(p) != "cost_model") plans.push_back(fixed_groups(p, ctx, tau_pad, short_rows));
  size_t pick = 0;
  for (size_t i = 1; i < plans.size(); ++i)
    if (total(plans[i], *cost) < total(plans[pick], *cost)) pick = i;
  std::vector<Group> alone = fixed_groups("per_request", ctx, tau_pad, short_rows);
  if (total(alone, *cost) <= (1 + cost->error) * total(plans[pick], *cost)) return {policy, alone};
  return {policy, plans[pick]};
}

std::vector<Group> plan_cached(const std::vector<int64_t>& past, const std::vector<int64_t>& kept, int64_t live,
                               const Buckets& buckets, const std::string& policy, const CostModel* cost) {
  const int64_t n = static_cast<int64_t>(kept.size()), max_batch = buckets.batch.back();
  auto call = [&](const std::vector<int64_t>& rows, bool bucketed) {
    int64_t g = 0, c = 0, used = 0;
    for (int64_t r : rows) g = std::max(g, kept[r]), c = std::max(c, past[r]), used += kept[r] + live;
    Group out{rows, rows.size() == 1 ? "eager" : "static", live, bucketed ? bucket(g, buckets.answer) : g,
              static_cast<int64_t>(rows.size()), 1, 0.0, bucket(c, buckets.prompt)};
    return out;
  };
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::vector<Group> alone;
  for (int64_t r : all) alone.push_back(call({r}, false));
  if (policy == "per_request" || n <= 1) return alone;
  std::vector<Group> naive;
  for (int64_t i = 0; i < n; i += max_batch)
    naive.push_back(call({all.begin() + i, all.begin() + std::min(n, i + max_batch)}, false));
  if (policy == "naive_pad") return naive;
  const std::vector<int64_t> ones(n, 1);
  std::vector<Group> by_answer;
  for (const auto& rows : by_bucket(all, Rows{past, kept, ones, buckets}, max_batch))
    by_answer.push_back(call(rows, true));
  if (policy != "cost_model") return by_answer;
  if (cost == nullptr)
    throw config_error("the cost_model policy needs a CostModel; SeerPipeline.calibrate_costs() measures one");
  // the split into runs of rows sorted by answer (then past, then row) that the model predicts fastest
  std::vector<int64_t> order = all;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return std::tie(kept[a], past[a]) < std::tie(kept[b], past[b]); });
  std::vector<double> best(n + 1, std::numeric_limits<double>::infinity());
  std::vector<int64_t> start(n + 1, 0);
  best[0] = 0;
  for (int64_t j = 1; j <= n; ++j)
    for (int64_t i = j - 1; i > std::max<int64_t>(-1, j - 1 - max_batch); --i) {
      const double t = best[i] + cost->seconds(call({order.begin() + i, order.begin() + j}, false));
      if (t < best[j]) best[j] = t, start[j] = i;
    }
  std::vector<Group> searched;
  for (int64_t j = n; j > 0; j = start[j]) {
    std::vector<int64_t> rows(order.begin() + start[j], order.begin() + j);
    std::sort(rows.begin(), rows.end());
    searched.push_back(call(rows, false));
  }
  std::reverse(searched.begin(), searched.end());
  const std::vector<Group>* plan = &searched;
  for (const auto* other : {&naive, &by_answer})
    if (total(*other, *cost) < total(*plan, *cost)) plan = other;
  return total(alone, *cost) <= (1 + cost->error) * total(*plan, *cost) ? alone : *plan;
}

}  // namespace seer
