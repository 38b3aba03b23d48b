#include "denoise.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "decoding.hpp"
#include "dispatch.hpp"

namespace seer {
namespace {

constexpr double NEG_INF = -std::numeric_limits<double>::infinity();

// The group's window graph calls over buffers allocated once: a refresh (the prompt computed, its K/V kept by the
// cache) or a cached step over the cache's snapshots; bound again when the group is re-formed to fewer entries.
class WindowCalls {
 public:
  WindowCalls(Backend& backend, const Manifest& manifest, Layout& layout, const CacheSpec& spec,
              const CacheConfig& cache, std::atomic<int64_t>* clock, const std::string& score)
      : gen_ids(layout.batch * layout.answer, manifest.special.mask_id), x0(gen_ids.size()),
        confidence(gen_ids.size()), kv(cache, spec, manifest.precision, layout, manifest.logit_shift != 0),
        backend_(backend),
        manifest_(manifest), layout_(layout), clock_(clock),
        output_(score.empty() ? confidence_output(manifest.graph("denoise")) : ConfidenceOutput{score, true}),
        refresh_(backend.call("denoise", clock)) {
    bind_refresh();
  }

  // Step t's prediction into x0 / confidence (a log-probability), after gen_ids was written.
  void run(int64_t t, bool refresh) {
    if (refresh) {
      refresh_.run();
      kv.store(t);
    } else {  // only the answer positions, against the cached prompt K/V (the refresh's segment and position ids)
      GraphCall cached = backend_.call("denoise", clock_);
      if (kv.live_columns().empty()) {
        feed(cached, 0);
      } else {  // shifted logits: each row's last prompt position too, the columns reordered (cached, live, answer)
        reorder();
        feed(cached, static_cast<int64_t>(kv.live_columns().size()), live_prefix_.data(), live_segments_.data(),
             live_positions_.data());
      }
      kv.bind_past(cached, t);
      cached.run();
    }
    if (!output_.is_log) log_in_place(confidence.data(), layout_.batch * layout_.answer);  // a 2.1 export
  }

  // The call of the live rows' batch entries alone when it pays (seer_trt.runtime.denoise._reform).
  void reform(const std::vector<char>& live, const CostModel* cost) {
    const int64_t b = layout_.batch, width = layout_.width;
    if (b == 1) return;
    std::vector<char> holds(b, 0);  // entries holding a live row's cells
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i] && layout_.slot[i * width] >= 0) holds[layout_.slot[i * width] / layout_.answer] = 1;
    std::vector<int64_t> keep;
    for (int64_t e = 0; e < b; ++e)
      if (holds[e]) keep.push_back(e);
    const int64_t k = static_cast<int64_t>(keep.size()), seq = layout_.prompt + layout_.answer;
    if (k == b) return;
    const bool pays = cost ? (*cost)(k, seq) < (*cost)(b, seq) * (1 - cost->error) : k <= b / 2;
    if (!pays) return;
    layout_ = select_entries(layout_, keep, manifest_.hidden_size * element_size(manifest_.precision));
    std::fill(gen_ids.begin(), gen_ids.end(), manifest_.special.mask_id);  // the cells past a row's window
    kv.select(keep);
    refresh_ = backend_.call("denoise", clock_);
    bind_refresh();
  }

  std::vector<int64_t> gen_ids, x0;  // [b, g] graph buffers, bound once per layout
  std::vector<float> confidence;     // [b, g] log-probability of x0
  GroupCache kv;

 private:
  void bind_refresh() {
    feed(refresh_, layout_.prompt);
    kv.bind_refresh(refresh_);  // the call that computes the prompt: an empty cache in, (kept) present K/V out
  }

  // The live prompt columns' embeddings and the reordered segment and position ids of a shifted cached step, for
  // the current layout (a re-formed group keeps the columns, with fewer entries)
  void reorder() {
    const int64_t b = layout_.batch, seq = layout_.prompt + layout_.answer;
    const size_t row = manifest_.hidden_size * element_size(manifest_.precision);
    const auto& live = kv.live_columns();
    const auto& order = kv.call_order();
    live_prefix_.resize(b * live.size() * row);
    live_segments_.resize(b * seq);
    live_positions_.resize(b * seq);
    for (int64_t e = 0; e < b; ++e) {
      for (size_t c = 0; c < live.size(); ++c)
        std::memcpy(live_prefix_.data() + (e * live.size() + c) * row,
                    layout_.prefix_embeds.data() + (e * layout_.prompt + live[c]) * row, row);
      for (int64_t j = 0; j < seq; ++j) {
        live_segments_[e * seq + j] = layout_.segment_ids[e * seq + order[j]];
        live_positions_[e * seq + j] = layout_.position_ids[e * seq + order[j]];
      }
    }
  }

  void feed(GraphCall& call, int64_t prompt, uint8_t* prefix = nullptr, int32_t* segments = nullptr,
            int64_t* positions = nullptr) {
    const int64_t b = layout_.batch, g = layout_.answer, seq = layout_.prompt + g;
    call.input("prefix_embeds", prefix ? prefix : layout_.prefix_embeds.data(), manifest_.precision,
               {b, prompt, manifest_.hidden_size});
    call.input("gen_ids", gen_ids.data(), "int64", {b, g});
    call.input("segment_ids", segments ? segments : layout_.segment_ids.data(), "int32", {b, seq});
    call.input("position_ids", positions ? positions : layout_.position_ids.data(), "int64", {b, seq});
    call.output("x0", x0.data(), "int64", {b, g});
    call.output(output_.name.c_str(), confidence.data(), "float32", {b, g});
  }

  Backend& backend_;
  const Manifest& manifest_;
  Layout& layout_;
  std::atomic<int64_t>* clock_;
  ConfidenceOutput output_;
  GraphCall refresh_;
  std::vector<uint8_t> live_prefix_;    // shifted cached steps: [b, live, D]
  std::vector<int32_t> live_segments_;  // [b, p + g] in the call's column order
  std::vector<int64_t> live_positions_;
};

}  // namespace

Denoised denoise(Backend& backend, const Manifest& manifest, Layout& layout, const Schedule& schedule,
                 const std::vector<int64_t>& rows, const std::optional<StepZeroPrediction>& step0,
                 const LoopSettings& loop, std::atomic<int64_t>* clock, const CacheSpec& cache_spec) {
  const int64_t n = static_cast<int64_t>(rows.size()), width = layout.width, mask = manifest.special.mask_id;
  const bool fixed = loop.rule.fixed();
  const int64_t block = loop.block_length > 0 ? loop.block_length : width, total = schedule.num_steps;
  std::vector<int64_t> cap(n);  // steps a row may take: its schedule's, or its window (a dynamic step commits one)
  int64_t horizon = 0;
  for (int64_t i = 0; i < n; ++i) {
    cap[i] = fixed ? schedule.steps[rows[i]] : schedule.kept[rows[i]];
    horizon = std::max(horizon, cap[i]);
  }
  WindowCalls calls(backend, manifest, layout, cache_spec, loop.cache, clock, loop.score);
  Committer commit(loop.rule, width);

  Denoised out{std::vector<int64_t>(n * width, mask), std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0), width};
  std::vector<int64_t>& x = out.tokens;
  std::vector<int64_t> stop(n, width);          // first committed stop id per row (width: none)
  std::vector<int64_t> ends(n, 0), block_end(n);  // each row's block end at the previous step, and at this one
  std::vector<char> open(n * width), live(n), eligible(width), chosen(width);
  std::vector<double> conf(width);
  for (int64_t t = 0; t < horizon; ++t) {
    bool any = false, boundary = false;  // boundary: a live row's block changes at t (the cache refreshes there)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      int64_t first = -1;  // the row's first position still to commit
      for (int64_t j = 0; j < width; ++j) {
        const bool o = x[i * width + j] == mask && j < schedule.kept[r] && j < stop[i];
        open[i * width + j] = o;
        if (o && first < 0) first = j;
      }
      live[i] = first >= 0 && t < cap[i];
      out.steps[i] += live[i];
      any |= live[i];
      block_end[i] = fixed ? schedule.block_end[r * total + t]
                           : std::min(schedule.kept[r], (std::max<int64_t>(first, 0) / block + 1) * block);
      boundary |= t > 0 && live[i] && block_end[i] != ends[i];
    }
    if (!any) break;
    ends = block_end;
    const bool reuse = t == 0 && step0.has_value();  // the full-depth step zero already predicted step 0
    if (!reuse) {
      calls.reform(live, loop.cost);
      for (int64_t c = 0; c < n * width; ++c)
        if (layout.slot[c] >= 0) calls.gen_ids[layout.slot[c]] = x[c];
      const bool refresh = calls.kv.refresh_due(t, boundary);
      calls.run(t, refresh);
      if (refresh)
        for (int64_t i = 0; i < n; ++i) out.refreshes[i] += live[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!live[i]) continue;
      const int64_t* slot = layout.slot.data() + i * width;
      for (int64_t j = 0; j < width; ++j) {
        eligible[j] = open[i * width + j] && j < block_end[i];
        const double c = !eligible[j] ? NEG_INF
                         : reuse      ? static_cast<double>(step0->confidence[i * step0->stride + j])
                                      : static_cast<double>(calls.confidence[slot[j]]);
        conf[j] = c;
      }
      int64_t open_masks = 0;  // Dream's schedule counts from the masks still open
      for (int64_t j = 0; j < width; ++j) open_masks += open[i * width + j];
      commit(conf, eligible, fixed ? schedule.count(rows[i], t, open_masks) : 0, chosen);
      for (int64_t j = 0; j < width; ++j)
        if (chosen[j]) x[i * width + j] = reuse ? step0->x0[i * step0->stride + j] : calls.x0[slot[j]];
      if (loop.stop_id)
        for (int64_t j = 0; j < width; ++j)
          if (x[i * width + j] == *loop.stop_id) {
            stop[i] = j;
            break;
          }
    }
  }
  return out;
}

}  // namespace seer
