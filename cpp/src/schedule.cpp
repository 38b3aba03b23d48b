#include "schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace seer {

int64_t truncated_steps(int64_t steps, int64_t kept, int64_t gen_length) {
  return std::max<int64_t>(1, (steps * kept + gen_length - 1) / gen_length);  // ceil(steps * L* / N)
}

std::vector<float> linspace32(float start, float end, int64_t count) {
  // torch.linspace in float32 as PyTorch's CPU kernel computes it (seer_trt.runtime.schedule.linspace32): a float32
  // step, start + step * i for the first half and end - step * (count - 1 - i) for the rest, each rounded once
  if (count == 1) return {start};
  const float step = (end - start) / static_cast<float>(count - 1);
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i)
    out[i] = static_cast<float>(i < count / 2 ? double(start) + double(step) * double(i)
                                              : double(end) - double(step) * double(count - 1 - i));
  return out;
}

std::vector<float> dream_fractions(int64_t steps) {
  const std::vector<float> t = linspace32(1.0f, DREAM_EPS, steps + 1);
  std::vector<float> out(steps);
  for (int64_t i = 0; i < steps; ++i)
    out[i] = i == steps - 1 ? std::numeric_limits<float>::infinity() : 1.0f - t[i + 1] / t[i];
  return out;
}

std::vector<int64_t> dream_transfer(int64_t masks, int64_t steps) {
  // Dream's diffusion_generate: int(masks left * (1 - t[i + 1] / t[i])) in float32, the last step all that are left
  std::vector<int64_t> out;
  int64_t left = masks;
  for (float f : dream_fractions(steps)) {
    const int64_t k = std::isinf(f) ? left : static_cast<int64_t>(static_cast<float>(left) * f);
    out.push_back(k);
    left -= k;
  }
  return out;
}

int64_t Schedule::count(int64_t b, int64_t t, int64_t open_masks) const {
  const int64_t i = std::min(t, num_steps - 1);
  if (fraction.empty()) return transfer[b * num_steps + i];
  const float f = fraction[b * num_steps + i];
  return std::isinf(f) ? open_masks : static_cast<int64_t>(static_cast<float>(open_masks) * f);
}

Schedule plan_schedule(const GenerationConfig& gen, const std::vector<int64_t>& kept) {
  Schedule s;
  s.kept = kept;
  const int64_t per_block = gen.steps / gen.num_blocks();
  std::vector<std::vector<int64_t>> transfer(kept.size()), block_end(kept.size());
  for (size_t b = 0; b < kept.size(); ++b) {
    const int64_t length = kept[b];
    if (gen.schedule == "dream") {  // one block: the whole kept window
      transfer[b] = dream_transfer(length, truncated_steps(gen.steps, length, gen.gen_length));
      block_end[b].assign(transfer[b].size(), length);
    }
    for (int64_t start = 0; gen.schedule != "dream" && start < length; start += gen.block_length) {
      const int64_t size = std::min(gen.block_length, length - start);
      const int64_t steps =
          size == gen.block_length ? per_block : (size * per_block + gen.block_length - 1) / gen.block_length;
      for (int64_t i = 0; i < steps; ++i) {  // get_num_transfer_tokens: remainder to the earliest steps
        transfer[b].push_back(size / steps + (i < size % steps ? 1 : 0));
        block_end[b].push_back(start + size);
      }
    }
    s.steps.push_back(truncated_steps(gen.steps, length, gen.gen_length));
    if (static_cast<int64_t>(transfer[b].size()) != s.steps.back())
      throw Error(Error::Kind::Runtime, "schedule: a row of " + std::to_string(length) + " positions planned " +
                                            std::to_string(transfer[b].size()) + " steps, expected " +
                                            std::to_string(s.steps.back()));
    s.num_steps = std::max(s.num_steps, s.steps.back());
  }
  s.transfer.assign(kept.size() * s.num_steps, 0);
  s.block_end.assign(kept.size() * s.num_steps, 0);
  if (gen.schedule == "dream") {
    s.fraction.assign(kept.size() * s.num_steps, 0.0f);
    for (size_t b = 0; b < kept.size(); ++b) {
      const std::vector<float> f = dream_fractions(s.steps[b]);
      std::copy(f.begin(), f.end(), s.fraction.begin() + b * s.num_steps);
    }
  }
  for (size_t b = 0; b < kept.size(); ++b)
    for (int64_t t = 0; t < s.num_steps; ++t) {
      const bool in = t < static_cast<int64_t>(transfer[b].size());
      s.transfer[b * s.num_steps + t] = in ? transfer[b][t] : 0;
      s.block_end[b * s.num_steps + t] = in ? block_end[b][t] : kept[b];
    }
  return s;
}

}  // namespace seer
