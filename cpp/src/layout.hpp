// How a group's rows sit in one graph call (seer_trt/runtime/layout.py, docs/DESIGN.md "Seer, exactly" hybrid execution, DESIGN "Graphs and their contract").
//
// In:  per row its prompt embeddings [P_i, D] and kept window L_i; the call's shape.
// Out: Layout: the inputs that stay fixed through the denoising loop (prefix_embeds, segment_ids,
//      position_ids) and where each row's answer cells sit in gen_ids [b, g].
//
//     static / eager (b = rows)           packed (b = 1)
//     row 0: pad.. prompt0 | ans0 pad     prompt0 prompt1 | ans0 ans1
//     row 1: pad.. prompt1 | ans1         segment ids 1 1 2 2 | 1 1 2 2 2, positions restart per row
// Segment 0 is padding; attention stays within equal non-zero ids, so a row computes the same values whatever
// shares its call. Positions count each row's own tokens from 0: max(cumsum(valid) - 1, 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace seer {

struct Prompt {
  const uint8_t* embeds;  // [P, D] in the graphs' precision
  int64_t length;         // P
  // Seer's end tail (seer_trt.runtime.layout.with_tails): `tail` copies of the row `tail_embed` [D] placed ahead of
  // the prompt in the call's prefix, at positions P + L .. P + L + tail - 1 (after the kept window of L)
  int64_t tail = 0;
  const uint8_t* tail_embed = nullptr;
};

struct Layout {
  int64_t batch = 0, prompt = 0, answer = 0;  // the call: prefix_embeds [b, p, D], gen_ids [b, g]
  std::vector<uint8_t> prefix_embeds;         // [b, p, D]
  std::vector<int32_t> segment_ids;           // [b, p + g]
  std::vector<int64_t> position_ids;          // [b, p + g]
  std::vector<int64_t> slot;                  // [rows, width]: cell (i, j)'s index in gen_ids, -1 past L_i
  int64_t width = 0;                          // L_max over the group's rows
};

// Rows one per batch entry, left-padded to prompt_len (which holds each row's tail and prompt), each window padded
// to gen_len.
Layout padded_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, int64_t prompt_len,
                     int64_t gen_len, size_t row_bytes);
// Every row in one sequence: all prompts, then all windows; segment i + 1 is row i.
Layout packed_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, size_t row_bytes);
// Batch entries `entries` (ascending) of l alone: the group re-formed from its live rows (Layout.select). A row
// keeps its index, so the loop's state is untouched; a row in no kept entry has no cells (slot -1) and is not fed.
Layout select_entries(const Layout& l, const std::vector<int64_t>& entries, size_t row_bytes);

}  // namespace seer
