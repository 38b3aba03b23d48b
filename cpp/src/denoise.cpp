#include "denoise.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace seer {

Denoised denoise(Backend& backend, const Manifest& manifest, Layout& layout, const Schedule& schedule,
                 const std::vector<int64_t>& rows, const std::optional<StepZeroPrediction>& step0,
                 std::optional<int64_t> stop_id, std::atomic<int64_t>* clock, const CacheSpec& cache_spec,
                 const CacheConfig& cache) {
  const int64_t n = static_cast<int64_t>(rows.size()), width = layout.width, mask = manifest.special.mask_id;
  int64_t num_steps = 0;
  for (int64_t r : rows) num_steps = std::max(num_steps, schedule.steps[r]);
  const int64_t cells = layout.batch * layout.answer, seq = layout.prompt + layout.answer;
  std::vector<int64_t> gen_ids(cells, mask), x0(cells);  // graph buffers, bound once
  std::vector<float> confidence(cells);
  const std::string& fdtype = manifest.precision;
  GraphCall call = backend.call("denoise", clock);
  call.input("prefix_embeds", layout.prefix_embeds.data(), fdtype, {layout.batch, layout.prompt, manifest.hidden_size});
  call.input("gen_ids", gen_ids.data(), "int64", {layout.batch, layout.answer});
  call.input("segment_ids", layout.segment_ids.data(), "int32", {layout.batch, seq});
  call.input("position_ids", layout.position_ids.data(), "int64", {layout.batch, seq});
  call.output("x0", x0.data(), "int64", {layout.batch, layout.answer});
  call.output("confidence", confidence.data(), "float32", {layout.batch, layout.answer});
  GroupCache kv(cache, cache_spec, fdtype, layout);
  kv.bind_refresh(call);  // the call that computes the prompt: an empty cache in, (kept) present K/V out

  Denoised out{std::vector<int64_t>(n * width, mask), std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0), width};
  std::vector<int64_t>& x = out.tokens;
  std::vector<int64_t> stop(n, width);       // first committed stop id per row (width: none)
  std::vector<int64_t> candidates(width);    // eligible positions of one row, reused
  std::vector<char> open(n * width);         // positions a row may still commit
  std::vector<char> live(n);
  for (int64_t t = 0; t < num_steps; ++t) {
    bool any = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      bool row_open = false;
      for (int64_t j = 0; j < width; ++j) {
        const bool o = x[i * width + j] == mask && j < schedule.kept[r] && j < stop[i];
        open[i * width + j] = o;
        row_open |= o;
      }
      live[i] = row_open && t < schedule.steps[r];
      out.steps[i] += live[i];
      any |= live[i];
    }
    if (!any) break;
    const bool reuse = t == 0 && step0.has_value();  // the full-depth step zero already predicted step 0
    if (!reuse) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < width; ++j)
          if (layout.slot[i * width + j] >= 0) gen_ids[layout.slot[i * width + j]] = x[i * width + j];
      bool boundary = false;  // a live row's block changes at t: the cache is refreshed there
      for (int64_t i = 0; i < n && t > 0; ++i) {
        const int64_t* ends = schedule.block_end.data() + rows[i] * schedule.num_steps;
        boundary |= live[i] && ends[t] != ends[t - 1];
      }
      if (kv.refresh_due(t, boundary)) {
        call.run();
        kv.store(t);
        for (int64_t i = 0; i < n; ++i) out.refreshes[i] += live[i];
      } else {  // only the answer positions, against the cached prompt K/V (the refresh's segment and position ids)
        GraphCall cached = backend.call("denoise", clock);
        cached.input("prefix_embeds", layout.prefix_embeds.data(), fdtype, {layout.batch, 0, manifest.hidden_size});
        cached.input("gen_ids", gen_ids.data(), "int64", {layout.batch, layout.answer});
        cached.input("segment_ids", layout.segment_ids.data(), "int32", {layout.batch, seq});
        cached.input("position_ids", layout.position_ids.data(), "int64", {layout.batch, seq});
        kv.bind_past(cached, t);
        cached.output("x0", x0.data(), "int64", {layout.batch, layout.answer});
        cached.output("confidence", confidence.data(), "float32", {layout.batch, layout.answer});
        cached.run();
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!live[i]) continue;
      const int64_t r = rows[i], k = schedule.transfer[r * schedule.num_steps + t];
      const int64_t end = std::min(width, schedule.block_end[r * schedule.num_steps + t]);
      const int64_t* pred = reuse ? step0->x0 + i * step0->stride : nullptr;
      const float* conf = reuse ? step0->confidence + i * step0->stride : nullptr;
      auto x0_at = [&](int64_t j) { return reuse ? pred[j] : x0[layout.slot[i * width + j]]; };
      auto conf_at = [&](int64_t j) { return reuse ? conf[j] : confidence[layout.slot[i * width + j]]; };
      int64_t count = 0;
      for (int64_t j = 0; j < end; ++j)
        if (open[i * width + j]) candidates[count++] = j;
      const int64_t take = std::min(k, count);
      // the k most confident, ties to the earlier position (a stable argsort of -confidence)
      auto before = [&](int64_t a, int64_t b) {  // NaN sorts last, as in numpy
        const float ca = std::isnan(conf_at(a)) ? -std::numeric_limits<float>::infinity() : conf_at(a);
        const float cb = std::isnan(conf_at(b)) ? -std::numeric_limits<float>::infinity() : conf_at(b);
        return ca > cb || (ca == cb && a < b);
      };
      if (take < count) std::nth_element(candidates.begin(), candidates.begin() + take, candidates.begin() + count, before);
      for (int64_t c = 0; c < take; ++c) x[i * width + candidates[c]] = x0_at(candidates[c]);
      if (stop_id)
        for (int64_t j = 0; j < width; ++j)
          if (x[i * width + j] == *stop_id) {
            stop[i] = j;
            break;
          }
    }
  }
  return out;
}

}  // namespace seer
