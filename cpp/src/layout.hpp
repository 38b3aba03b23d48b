// How rows of different prompt and answer lengths sit in one graph call (seer_trt/runtime/layout.py, docs/DESIGN.md "Seer, exactly" hybrid execution, DESIGN "Graphs and their contract").
//
// In:  per row a prefix [C_i, D] (Seer's end tail, then the prompt) with its position ids, and a kept window L_i;
//      the call's shape (static bucket, exact, or packed); for a cached step, the past length of the call's K/V.
// Out: Layout: a call's inputs besides the answer ids (prefix_embeds, segment_ids, position_ids), where each row's
//      answer cells sit in gen_ids [b, g], and where each row's prefix columns sit (a refresh's K/V of that row are
//      read from there).
//
//     static / eager (b = rows)           packed (b = 1)                      cached (b = rows)
//     row 0: pad.. prompt0 | ans0 pad     prompt0 prompt1 | ans0 ans1         row 0: pad.. past0 | ans0 pad
//     row 1: pad.. prompt1 | ans1         segment ids 1 1 2 2 | 1 1 2 2 2     row 1: pad..  past1 | ans1
//                                         positions restart per row
// Segment 0 is padding; attention stays within equal non-zero ids, so a row computes the same values whatever
// shares its call. Positions count each row's own tokens from 0 (prompt, then answer). A cached step's past columns
// are the row's prompt K/V from its last refresh, right-aligned to the call's past length; they carry their
// rotation, so their position ids are not read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace seer {

struct Prompt {
  const uint8_t* embeds;  // [P, D] in the graphs' precision
  int64_t length;         // P
  // Seer's end tail (with_tails): `tail` copies of the row `tail_embed` [D] placed ahead of the prompt in the call's
  // prefix, at positions P + L .. P + L + tail - 1 (after the kept window of L)
  int64_t tail = 0;
  const uint8_t* tail_embed = nullptr;
};

// What a refresh computes of one row: its end tail, then its prompt (seer_trt.runtime.layout.with_tails).
struct Prefix {
  std::vector<uint8_t> embeds;     // [C, D]
  std::vector<int64_t> positions;  // [C] their position ids
  int64_t prompt_len = 0;          // P: the prompt's length (answer position j sits at P + j)
  int64_t size() const { return static_cast<int64_t>(positions.size()); }
};
Prefix with_tail(const Prompt& prompt, int64_t kept, size_t row_bytes);

struct Layout {
  int64_t batch = 0, prompt = 0, answer = 0;  // the call: prefix_embeds [b, p, D], gen_ids [b, g]
  int64_t past = 0;                           // a cached call's past columns, ahead of the prompt's in the ids
  std::vector<uint8_t> prefix_embeds;         // [b, p, D]
  std::vector<int32_t> segment_ids;           // [b, past + p + g]
  std::vector<int64_t> position_ids;          // [b, past + p + g]
  std::vector<int64_t> slot;                  // [rows, width]: cell (i, j)'s index in gen_ids, -1 past L_i
  int64_t width = 0;                          // L_max over the call's rows
  std::vector<int64_t> entry, column;         // [rows] the batch entry and first column of each row's prefix (past)
  int64_t seq() const { return past + prompt + answer; }
  size_t bytes() const { return prefix_embeds.size() + segment_ids.size() * 4 + position_ids.size() * 8; }
};

// Rows one per batch entry, left-padded to prompt_len (which holds each row's prefix), each window padded to gen_len.
Layout rows_padded(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, int64_t prompt_len,
                   int64_t gen_len, size_t row_bytes);
// Every row in one sequence: all prefixes, then all windows; segment i + 1 is row i.
Layout rows_packed(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, size_t row_bytes);
// A cached step (docs/DESIGN.md "Prompt K/V cache"): one row per batch entry, its cached prefix K/V right-aligned in
// past_len past columns, then (shifted: Dream's shifted logits) its last prefix position computed live, then its
// answer padded to gen_len; prefix_embeds holds only the live positions ([b, 0, D], or [b, 1, D] when shifted).
Layout rows_cached(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, int64_t past_len,
                   int64_t gen_len, bool shifted, size_t row_bytes);
// rows_padded of prompts whose prefixes are made here (step zero, the cost calibration).
Layout padded_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, int64_t prompt_len,
                     int64_t gen_len, size_t row_bytes);

}  // namespace seer
