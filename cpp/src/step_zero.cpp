#include "step_zero.hpp"

#include <algorithm>

namespace seer {

StepZeroOut run_step_zero(Backend& backend, const Manifest& manifest, const std::vector<Prompt>& prompts, int64_t n,
                          std::atomic<int64_t>* clock, const CacheSpec& cache_spec) {
  const SeerConfig& seer = manifest.seer;
  const int64_t rows = static_cast<int64_t>(prompts.size()), chunk = manifest.buckets.batch.back();
  const size_t row_bytes = manifest.hidden_size * element_size(manifest.precision);
  StepZeroOut out;
  out.profile.resize(rows * n);
  if (seer.full_depth()) out.x0.resize(rows * n), out.confidence.resize(rows * n);
  const std::string graph = seer.full_depth() ? "denoise" : "step_zero";
  const std::string signal = seer.full_depth() ? "p_end" : seer.signal == "probe" ? "probe_score" : "sparsity";
  const ConfidenceOutput confidence = confidence_output(manifest.graph("denoise"));
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t b = std::min(chunk, rows - start);
    std::vector<Prompt> part(prompts.begin() + start, prompts.begin() + start + b);
    int64_t longest = 0;
    for (const auto& p : part) longest = std::max(longest, p.length);
    Layout l = padded_layout(part, std::vector<int64_t>(b, n), longest, n, row_bytes);  // the whole window valid
    std::vector<int64_t> gen_ids(b * n, manifest.special.mask_id);
    std::vector<float> profile(b * n);
    GraphCall call = backend.call(graph, clock);
    call.input("prefix_embeds", l.prefix_embeds.data(), manifest.precision, {b, longest, manifest.hidden_size});
    call.input("gen_ids", gen_ids.data(), "int64", {b, n});
    call.input("segment_ids", l.segment_ids.data(), "int32", {b, longest + n});
    call.input("position_ids", l.position_ids.data(), "int64", {b, longest + n});
    NoCache none;  // the full-depth pass computes the prompt: an empty cache
    if (seer.full_depth()) none.bind(call, cache_spec, manifest.precision, b);
    call.output(signal.c_str(), profile.data(), "float32", {b, n});
    if (seer.full_depth()) {
      call.output("x0", out.x0.data() + start * n, "int64", {b, n});
      call.output(confidence.name.c_str(), out.confidence.data() + start * n, "float32", {b, n});
    }
    call.run();
    if (seer.full_depth() && !confidence.is_log) log_in_place(out.confidence.data() + start * n, b * n);  // 2.1
    std::copy(profile.begin(), profile.end(), out.profile.begin() + start * n);
  }
  return out;
}

}  // namespace seer
