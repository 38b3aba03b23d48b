// Block layout and step budget of the denoising loop, before and after truncation (seer_trt/runtime/schedule.py,
// docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch", "Seer, exactly").
//
// In:  generation settings (N, steps, block_length), the kept window L* per row, and the request's Counts (chosen
//      once with its decoding, decoding.hpp).
// Out: Schedule: tokens each row commits at each step, and the block end that bounds the eligible positions.
// A row kept to L* of N positions gets ceil(steps * L* / N) steps (at least 1). How a row's commits are laid out over
// those steps is the Counts' plan: LLaDA-V's Spread (steps // num_blocks steps per block, a block's masks spread
// evenly over its steps, the remainder to the earliest; the blocks recomputed on L*, a final partial block getting
// its share rounded up) or Dream's Timesteps (one block; int(m * (1 - t[i + 1] / t[i])) of the m masks left).
#pragma once

#include <cstdint>
#include <vector>

#include "decoding.hpp"

namespace seer {

struct Schedule {
  std::vector<int64_t> kept;       // [B] L* (or N)
  std::vector<int64_t> steps;      // [B] steps each row uses
  int64_t num_steps = 0;           // T: the longest row's
  std::vector<int64_t> transfer;   // [B, T] tokens row b commits at step t
  std::vector<int64_t> block_end;  // [B, T] at step t only positions < block_end may commit
  // Timesteps: [B, T] float32 1 - t[i + 1] / t[i], inf at a row's last step, 0 past it (empty otherwise); the count
  // is then taken from the masks still open (Row::count, denoise.hpp), as diffusion_generate does
  std::vector<float> fraction;
};

int64_t truncated_steps(int64_t steps, int64_t kept, int64_t gen_length);
Schedule plan_schedule(const GenerationConfig& gen, const std::vector<int64_t>& kept, const Counts& counts);

}  // namespace seer
