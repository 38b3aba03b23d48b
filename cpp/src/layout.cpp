#include "layout.hpp"

#include <algorithm>
#include <cstring>

namespace seer {
namespace {

int64_t widest(const std::vector<int64_t>& kept) { return *std::max_element(kept.begin(), kept.end()); }

// the answer cells of the rows one per batch entry: cell (i, j) at i * gen_len + j
void entry_slots(Layout& l, const std::vector<int64_t>& kept) {
  l.width = widest(kept);
  l.slot.assign(kept.size() * l.width, -1);
  for (size_t b = 0; b < kept.size(); ++b)
    for (int64_t j = 0; j < kept[b]; ++j) l.slot[b * l.width + j] = static_cast<int64_t>(b) * l.answer + j;
}

}  // namespace

Prefix with_tail(const Prompt& prompt, int64_t kept, size_t row_bytes) {
  Prefix out;
  out.prompt_len = prompt.length;
  out.embeds.resize((prompt.tail + prompt.length) * row_bytes);
  for (int64_t i = 0; i < prompt.tail; ++i) {  // the tail stands after the window: P + L + i
    std::memcpy(out.embeds.data() + i * row_bytes, prompt.tail_embed, row_bytes);
    out.positions.push_back(prompt.length + kept + i);
  }
  if (prompt.length) std::memcpy(out.embeds.data() + prompt.tail * row_bytes, prompt.embeds, prompt.length * row_bytes);
  for (int64_t i = 0; i < prompt.length; ++i) out.positions.push_back(i);
  return out;
}

Layout rows_padded(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, int64_t prompt_len,
                   int64_t gen_len, size_t row_bytes) {
  Layout l;
  const int64_t n = static_cast<int64_t>(rows.size()), seq = prompt_len + gen_len;
  l.batch = n, l.prompt = prompt_len, l.answer = gen_len;
  l.prefix_embeds.assign(n * prompt_len * row_bytes, 0);
  l.segment_ids.assign(n * seq, 0);
  l.position_ids.assign(n * seq, 0);
  bool tails = false;  // a row whose prefix is more than its prompt: the positions are each row's own
  for (const Prefix* r : rows) tails |= r->size() != r->prompt_len;
  for (int64_t b = 0; b < n; ++b) {
    const Prefix& r = *rows[b];
    const int64_t pad = prompt_len - r.size();
    l.entry.push_back(b), l.column.push_back(pad);
    if (r.size())
      std::memcpy(l.prefix_embeds.data() + (b * prompt_len + pad) * row_bytes, r.embeds.data(), r.embeds.size());
    int64_t count = 0;  // valid tokens so far: position = max(count - 1, 0)
    for (int64_t k = 0; k < seq; ++k) {
      const bool valid = k < prompt_len ? k >= pad : k - prompt_len < kept[b];
      count += valid;
      l.segment_ids[b * seq + k] = valid;
      l.position_ids[b * seq + k] = std::max<int64_t>(count - 1, 0);
    }
    if (tails) {  // the prefix's own positions, the answer's from P (padding at 0)
      std::copy(r.positions.begin(), r.positions.end(), l.position_ids.begin() + b * seq + pad);
      for (int64_t j = 0; j < gen_len; ++j)
        l.position_ids[b * seq + prompt_len + j] = j < kept[b] ? r.prompt_len + j : 0;
    }
  }
  entry_slots(l, kept);
  return l;
}

Layout rows_packed(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, size_t row_bytes) {
  Layout l;
  const int64_t n = static_cast<int64_t>(rows.size());
  int64_t total_p = 0, total_g = 0;
  for (int64_t b = 0; b < n; ++b) total_p += rows[b]->size(), total_g += kept[b];
  l.batch = 1, l.prompt = total_p, l.answer = total_g, l.width = widest(kept);
  l.prefix_embeds.resize(total_p * row_bytes);
  l.segment_ids.reserve(total_p + total_g);
  l.position_ids.reserve(total_p + total_g);
  l.slot.assign(n * l.width, -1);
  int64_t column = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Prefix& r = *rows[b];
    l.entry.push_back(0), l.column.push_back(column);
    if (r.size()) std::memcpy(l.prefix_embeds.data() + column * row_bytes, r.embeds.data(), r.embeds.size());
    column += r.size();
    l.segment_ids.insert(l.segment_ids.end(), r.size(), static_cast<int32_t>(b + 1));
    l.position_ids.insert(l.position_ids.end(), r.positions.begin(), r.positions.end());
  }
  int64_t cell = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = 0; j < kept[b]; ++j, ++cell) {
      l.segment_ids.push_back(static_cast<int32_t>(b + 1));
      l.position_ids.push_back(rows[b]->prompt_len + j);
      l.slot[b * l.width + j] = cell;
    }
  return l;
}

Layout rows_cached(const std::vector<const Prefix*>& rows, const std::vector<int64_t>& kept, int64_t past_len,
                   int64_t gen_len, bool shifted, size_t row_bytes) {
  Layout l;
  const int64_t n = static_cast<int64_t>(rows.size()), live = shifted ? 1 : 0, seq = past_len + live + gen_len;
  l.batch = n, l.past = past_len, l.prompt = live, l.answer = gen_len;
  l.prefix_embeds.resize(n * live * row_bytes);
  l.segment_ids.assign(n * seq, 0);
  l.position_ids.assign(n * seq, 0);
  for (int64_t b = 0; b < n; ++b) {
    const Prefix& r = *rows[b];
    const int64_t cached = r.size() - live, first = past_len - cached;  // past columns the row holds, from first
    l.entry.push_back(b), l.column.push_back(first);
    int32_t* seg = l.segment_ids.data() + b * seq;
    int64_t* pos = l.position_ids.data() + b * seq;
    for (int64_t c = 0; c < cached; ++c) seg[first + c] = 1, pos[first + c] = r.positions[c];
    for (int64_t c = 0; c < live; ++c) {
      seg[past_len + c] = 1, pos[past_len + c] = r.positions[cached + c];
      std::memcpy(l.prefix_embeds.data() + (b * live + c) * row_bytes, r.embeds.data() + (cached + c) * row_bytes,
                  row_bytes);
    }
    for (int64_t j = 0; j < kept[b]; ++j) seg[past_len + live + j] = 1, pos[past_len + live + j] = r.prompt_len + j;
  }
  entry_slots(l, kept);
  return l;
}

Layout padded_layout(const std::vector<Prompt>& prompts, const std::vector<int64_t>& kept, int64_t prompt_len,
                     int64_t gen_len, size_t row_bytes) {
  std::vector<Prefix> prefixes;
  for (size_t b = 0; b < prompts.size(); ++b) prefixes.push_back(with_tail(prompts[b], kept[b], row_bytes));
  std::vector<const Prefix*> rows;
  for (const Prefix& p : prefixes) rows.push_back(&p);
  return rows_padded(rows, kept, prompt_len, gen_len, row_bytes);
}

}  // namespace seer
