#include "layout.hpp"

#include <algorithm>
#include <cstring>

namespace seer {

Layout padded_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, int64_t prompt_len,
                     int64_t gen_len, size_t row_bytes) {
  Layout l;
  const int64_t n = static_cast<int64_t>(prompts.size());
  l.batch = n, l.prompt = prompt_len, l.answer = gen_len;
  l.width = *std::max_element(kept.begin(), kept.end());
  const int64_t seq = prompt_len + gen_len;
  l.prefix_embeds.assign(n * prompt_len * row_bytes, 0);
  l.segment_ids.assign(n * seq, 0);
  l.position_ids.assign(n * seq, 0);
  l.slot.assign(n * l.width, -1);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t p = prompts[b].length, t = prompts[b].tail, pad = prompt_len - p - t;
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(l.prefix_embeds.data() + (b * prompt_len + pad + i) * row_bytes, prompts[b].tail_embed, row_bytes);
    std::memcpy(l.prefix_embeds.data() + (b * prompt_len + pad + t) * row_bytes, prompts[b].embeds, p * row_bytes);
    int64_t count = 0;  // valid tokens so far: position = max(count - 1, 0)
    for (int64_t k = 0; k < seq; ++k) {
      const bool valid = k < prompt_len ? k >= pad : k - prompt_len < kept[b];
      count += valid;
      l.segment_ids[b * seq + k] = valid;
      l.position_ids[b * seq + k] = std::max<int64_t>(count - 1, 0);
    }
    if (t > 0) {  // the tail stands after the window: P + L + i; the prompt from 0, the answer from P
      for (int64_t i = 0; i < t; ++i) l.position_ids[b * seq + pad + i] = p + kept[b] + i;
      for (int64_t i = 0; i < p; ++i) l.position_ids[b * seq + pad + t + i] = i;
      for (int64_t j = 0; j < gen_len; ++j) l.position_ids[b * seq + prompt_len + j] = j < kept[b] ? p + j : 0;
    }
    for (int64_t j = 0; j < kept[b]; ++j) l.slot[b * l.width + j] = b * gen_len + j;
  }
  return l;
}

Layout packed_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, size_t row_bytes) {
  Layout l;
  const int64_t n = static_cast<int64_t>(prompts.size());
  int64_t total_p = 0, total_g = 0;
  for (int64_t b = 0; b < n; ++b) total_p += prompts[b].tail + prompts[b].length, total_g += kept[b];
  l.batch = 1, l.prompt = total_p, l.answer = total_g;
  l.width = *std::max_element(kept.begin(), kept.end());
  l.prefix_embeds.resize(total_p * row_bytes);
  l.segment_ids.reserve(total_p + total_g);
  l.position_ids.reserve(total_p + total_g);
  l.slot.assign(n * l.width, -1);
  size_t offset = 0;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < prompts[b].tail; ++i, offset += row_bytes) {
      std::memcpy(l.prefix_embeds.data() + offset, prompts[b].tail_embed, row_bytes);
      l.segment_ids.push_back(b + 1), l.position_ids.push_back(prompts[b].length + kept[b] + i);
    }
    std::memcpy(l.prefix_embeds.data() + offset, prompts[b].embeds, prompts[b].length * row_bytes);
    offset += prompts[b].length * row_bytes;
    for (int64_t k = 0; k < prompts[b].length; ++k) l.segment_ids.push_back(b + 1), l.position_ids.push_back(k);
  }
  int64_t cell = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = 0; j < kept[b]; ++j, ++cell) {
      l.segment_ids.push_back(b + 1);
      l.position_ids.push_back(prompts[b].length + j);
      l.slot[b * l.width + j] = cell;
    }
  return l;
}

Layout select_entries(const Layout& l, const std::vector<int64_t>& entries, size_t row_bytes) {
  Layout out;
  const int64_t k = static_cast<int64_t>(entries.size()), seq = l.prompt + l.answer;
  out.batch = k, out.prompt = l.prompt, out.answer = l.answer, out.width = l.width;
  out.prefix_embeds.resize(k * l.prompt * row_bytes);
  out.segment_ids.resize(k * seq);
  out.position_ids.resize(k * seq);
  std::vector<int64_t> renumbered(l.batch, -1);  // old entry -> new entry, -1 when left out
  for (int64_t e = 0; e < k; ++e) {
    const int64_t from = entries[e];
    renumbered[from] = e;
    std::memcpy(out.prefix_embeds.data() + e * l.prompt * row_bytes, l.prefix_embeds.data() + from * l.prompt * row_bytes,
                l.prompt * row_bytes);
    std::copy_n(l.segment_ids.begin() + from * seq, seq, out.segment_ids.begin() + e * seq);
    std::copy_n(l.position_ids.begin() + from * seq, seq, out.position_ids.begin() + e * seq);
  }
  out.slot.assign(l.slot.size(), -1);
  for (size_t c = 0; c < l.slot.size(); ++c)
    if (l.slot[c] >= 0 && renumbered[l.slot[c] / l.answer] >= 0)
      out.slot[c] = renumbered[l.slot[c] / l.answer] * l.answer + l.slot[c] % l.answer;
  return out;
}

}  // namespace seer
