// Block layout and step budget of the denoising loop, before and after truncation (seer_trt/runtime/schedule.py,
// docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").
//
// In:  generation settings (N, steps, block_length) and the kept window L* per row.
// Out: Schedule: tokens each row commits at each step, and the block end that bounds the eligible positions.
// A row kept to L* of N positions gets ceil(steps * L* / N) steps (at least 1) over a block layout recomputed
// on L*: full blocks keep their steps, a final partial block gets its share rounded up; within a block its
// masks are spread evenly over its steps, the remainder to the earliest. Schedule "dream" (Dream's diffusion_generate):
// one block; step i commits int(m * (1 - t[i + 1] / t[i])) of the m masks left, t = linspace(1, 1e-3, steps + 1) in
// float32, the last step all that are left.
#pragma once

#include <cstdint>
#include <vector>

#include "manifest.hpp"

namespace seer {

struct Schedule {
  std::vector<int64_t> kept;       // [B] L* (or N)
  std::vector<int64_t> steps;      // [B] steps each row uses
  int64_t num_steps = 0;           // T: the longest row's
  std::vector<int64_t> transfer;   // [B, T] tokens row b commits at step t
  std::vector<int64_t> block_end;  // [B, T] at step t only positions < block_end may commit
  // schedule "dream": [B, T] float32 1 - t[i + 1] / t[i], inf at a row's last step, 0 past it (empty otherwise);
  // the count is then taken from the masks still open (count), as diffusion_generate does
  std::vector<float> fraction;
  // Tokens row b commits at step t with `open_masks` masks still open (seer_trt.runtime.schedule.Schedule.count)
  int64_t count(int64_t b, int64_t t, int64_t open_masks) const;
};

constexpr float DREAM_EPS = 1e-3f;  // DreamGenerationConfig's eps

int64_t truncated_steps(int64_t steps, int64_t kept, int64_t gen_length);
std::vector<float> linspace32(float start, float end, int64_t count);  // torch.linspace(start, end, count), float32
std::vector<int64_t> dream_transfer(int64_t masks, int64_t steps);     // Dream's count per step
std::vector<float> dream_fractions(int64_t steps);  // 1 - t[i + 1] / t[i] per step, inf at the last
Schedule plan_schedule(const GenerationConfig& gen, const std::vector<int64_t>& kept);

}  // namespace seer
