#include "schedule.hpp"

#include <algorithm>

namespace seer {

int64_t truncated_steps(int64_t steps, int64_t kept, int64_t gen_length) {
  return std::max<int64_t>(1, (steps * kept + gen_length - 1) / gen_length);  // ceil(steps * L* / N)
}

Schedule plan_schedule(const GenerationConfig& gen, const std::vector<int64_t>& kept, const Counts& counts) {
  Schedule s;
  s.kept = kept;
  std::vector<Planned> planned;  // once per request
  bool fractions = false;
  for (int64_t length : kept) {
    s.steps.push_back(truncated_steps(gen.steps, length, gen.gen_length));
    planned.push_back(counts.plan(length, s.steps.back(), gen.block_length, gen.steps / gen.num_blocks()));
    if (static_cast<int64_t>(planned.back().transfer.size()) != s.steps.back())
      throw Error(Error::Kind::Runtime, "schedule: a row of " + std::to_string(length) + " positions planned " +
                                            std::to_string(planned.back().transfer.size()) + " steps, expected " +
                                            std::to_string(s.steps.back()));
    s.num_steps = std::max(s.num_steps, s.steps.back());
    fractions |= !planned.back().fraction.empty();
  }
  const size_t rows = kept.size(), total = static_cast<size_t>(s.num_steps);
  s.transfer.assign(rows * total, 0);
  s.block_end.assign(rows * total, 0);
  if (fractions) s.fraction.assign(rows * total, 0.0f);
  for (size_t b = 0; b < rows; ++b) {
    const Planned& p = planned[b];
    std::copy(p.transfer.begin(), p.transfer.end(), s.transfer.begin() + b * total);
    std::copy(p.block_end.begin(), p.block_end.end(), s.block_end.begin() + b * total);
    std::fill(s.block_end.begin() + b * total + p.block_end.size(), s.block_end.begin() + (b + 1) * total, kept[b]);
    if (!p.fraction.empty()) std::copy(p.fraction.begin(), p.fraction.end(), s.fraction.begin() + b * total);
  }
  return s;
}

}  // namespace seer
