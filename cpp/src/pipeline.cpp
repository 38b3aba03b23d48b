// Pipeline: requests in, answers out (seer_trt/runtime/pipeline.py, docs/DESIGN.md "Layout and dependency direction", "Seer, exactly").
//
//     preprocess (embed.cpp) ─► step zero (step_zero.cpp) ─► boundary (boundary.cpp) ─► schedule (schedule.cpp)
//     ─► dispatch (dispatch.cpp) ─► denoise (denoise.cpp, per group, in its layout.cpp layout) ─► detokenize
//
// Requests with the same generation settings (the decoding rule in its one spelling included), mode (Seer, padded,
// oracle window), early stopping and prompt K/V cache policy run together, groups in the order of their first
// request, rows in request order: the same graph calls as the Python runtime, so the same tokens. A bad request gets its error and the others complete. Sessions are shared
// between threads; every buffer of a call belongs to that call.
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

#include "boundary.hpp"
#include "decoding.hpp"
#include "denoise.hpp"
#include "detokenize.hpp"
#include "dispatch.hpp"
#include "embed.hpp"
#include "schedule.hpp"
#include "step_zero.hpp"

namespace seer {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Prepared {
  size_t index;
  PromptEmbeds prompt;
  double seconds;       // preprocess
  int64_t graph_ns;     // of which in graphs
};

struct Key {
  GenerationConfig gen;
  int mode;  // 0 seer, 1 full (padded baseline), 2 window
  bool early_stop;
  CacheConfig cache;
  bool operator==(const Key& o) const {
    return gen == o.gen && mode == o.mode && early_stop == o.early_stop && cache == o.cache;
  }
};

}  // namespace

struct Pipeline::Impl {
  std::string folder;
  Options options;
  Manifest manifest;
  std::unique_ptr<Backend> backend;
  CacheSpec cache_spec;  // the window graph's cache inputs (none in a 2.0 export)
  CacheConfig cache;     // the policy of requests that choose none
  std::unique_ptr<Detokenizer> detokenizer;
  std::mutex cost_mutex;
  std::unique_ptr<CostModel> cost;  // measured on the first batch of several rows that needs it
  std::vector<uint8_t> tail_embed;  // [D] the token Seer's end tail holds, embedded at open (seer.tail > 0)

  GenerationConfig generation(const Request& r) const;
  CacheConfig cache_for(const Request& r) const;
  void run(const Key& key, const std::vector<const Request*>& requests, std::vector<Prepared>& rows,
           const std::string& policy, std::vector<Result>& results);
  void calibrate_costs();
};

GenerationConfig Pipeline::Impl::generation(const Request& r) const {
  const GenerationConfig& base = manifest.generation;
  GenerationConfig gen = base;
  if (r.decoding) {  // checked first, with the value types, as seer_trt.runtime.request.check_settings does
    try {
      gen.decoding = canonical_decoding(*r.decoding);
    } catch (const Error& err) {
      throw input_error(err.what());
    }
  }
  if (r.remasking) gen.remasking = *r.remasking;
  choose(gen, manifest);  // refuses a remasking the C++ runtime cannot rank by (decoding.hpp)
  if (r.gen_length) {  // a new window: the export's rule (manifest "lengths", WindowRule) shapes its blocks and steps
    const int64_t n = *r.gen_length;
    std::pair<int64_t, int64_t> shape;
    try {
      shape = manifest.lengths.shape(n, base, r.block_length);
    } catch (const Error& err) {
      throw input_error(err.what());
    }
    gen.gen_length = n;
    gen.block_length = shape.first;
    gen.steps = r.steps ? *r.steps : shape.second;
  } else {
    if (r.steps) gen.steps = *r.steps;
    if (r.block_length) gen.block_length = *r.block_length;
  }
  try {
    gen.validate();
  } catch (const Error& err) {
    throw input_error(std::string("request settings: ") + err.what());
  }
  if (gen.steps > gen.gen_length)
    throw input_error("steps " + std::to_string(gen.steps) + " exceeds gen_length " + std::to_string(gen.gen_length) +
                      ": a step commits at least one token, so the steps past " + std::to_string(gen.gen_length) +
                      " would only repeat the model for nothing; pass steps <= gen_length");
  const int64_t largest = manifest.buckets.answer.back();
  if (gen.gen_length > largest)
    throw input_error("gen_length " + std::to_string(gen.gen_length) + " exceeds the largest answer bucket " +
                      std::to_string(largest) + "; ask for <= " + std::to_string(largest) +
                      " or re-export with larger buckets");
  if (r.window && (*r.window < 1 || *r.window > gen.gen_length))
    throw input_error("window " + std::to_string(*r.window) + " must lie in [1, gen_length " +
                      std::to_string(gen.gen_length) + "]");
  return gen;
}

CacheConfig Pipeline::Impl::cache_for(const Request& r) const {
  CacheConfig c = cache;
  if (r.cache) c.mode = *r.cache;
  if (r.refresh_interval) c.refresh = *r.refresh_interval;
  try {
    c.validate();
    check_cache(c, cache_spec);
  } catch (const Error& err) {
    throw input_error(err.what());
  }
  return c;
}

void Pipeline::Impl::calibrate_costs() {
  const size_t row_bytes = manifest.hidden_size * element_size(manifest.precision);
  const Buckets& bk = manifest.buckets;
  std::vector<std::array<int64_t, 3>> shapes;
  for (const auto& s : manifest.cost_calibration.shapes) {
    std::array<int64_t, 3> c = {std::min(s[0], bk.batch.back()), std::max<int64_t>(1, std::min(s[1], bk.prompt.back())),
                                std::min(s[2], bk.answer.back())};
    if (std::find(shapes.begin(), shapes.end(), c) == shapes.end()) shapes.push_back(c);
  }
  std::vector<std::pair<int64_t, int64_t>> sizes;
  std::vector<double> seconds;
  std::atomic<int64_t> clock{0};
  for (const auto& [b, p, g] : shapes) {
    std::vector<uint8_t> zeros(p * row_bytes, 0);
    std::vector<Prompt> prompts(b, Prompt{zeros.data(), p});
    std::vector<int64_t> kept(b, g), rows(b);
    for (int64_t i = 0; i < b; ++i) rows[i] = i;
    Schedule one_step{kept, std::vector<int64_t>(b, 1), 1, std::vector<int64_t>(b, 0), std::vector<int64_t>(b, g)};
    Layout layout = padded_layout(prompts, kept, p, g, row_bytes);
    double fastest = 1e300;
    for (int64_t k = 0; k <= manifest.cost_calibration.repeats; ++k) {  // the first warms the session
      const auto start = Clock::now();
      denoise(*backend, manifest, layout, one_step, rows, std::nullopt, LoopSettings{}, &clock, cache_spec);
      if (k) fastest = std::min(fastest, since(start));
    }
    sizes.emplace_back(b, p + g);
    seconds.push_back(fastest);
  }
  cost = std::make_unique<CostModel>(CostModel::fit(sizes, seconds));
}

void Pipeline::Impl::run(const Key& key, const std::vector<const Request*>& requests, std::vector<Prepared>& rows,
                         const std::string& policy, std::vector<Result>& results) {
  const SpecialTokens& special = manifest.special;
  const int64_t n = key.gen.gen_length, count = static_cast<int64_t>(rows.size());
  const size_t row_bytes = manifest.hidden_size * element_size(manifest.precision);
  Timings clock;
  std::atomic<int64_t> graph_ns{0};
  std::vector<Prompt> prompts;
  std::vector<int64_t> lengths;
  for (const auto& r : rows) prompts.push_back({r.prompt.embeds.data(), r.prompt.length}), lengths.push_back(r.prompt.length);
  std::vector<int64_t> kept(count, n);
  if (key.mode == 2)
    for (int64_t i = 0; i < count; ++i) kept[i] = *requests[rows[i].index]->window;
  StepZeroOut zero;
  if (key.mode == 0) {
    auto t0 = Clock::now();
    zero = run_step_zero(*backend, manifest, prompts, n, &graph_ns, cache_spec);
    clock.step_zero = since(t0);
    t0 = Clock::now();
    kept = detect(zero.profile, count, n, manifest.seer);
    clock.boundary = since(t0);
  }
  if (policy == "cost_model" && count > 1) {
    std::lock_guard<std::mutex> lock(cost_mutex);
    if (!cost) calibrate_costs();
  }
  auto t0 = Clock::now();
  const Schedule schedule = plan_schedule(key.gen, kept);
  // Seer's end tail (SeerPipeline.tails): ceil(tail * (N - L*)) committed end tokens after each cut row's window,
  // none for a row kept whole (the padded loop), no more than the largest prompt bucket leaves room for
  if (manifest.seer.tail > 0) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t want = static_cast<int64_t>(std::ceil(manifest.seer.tail * static_cast<double>(n - kept[i])));
      const int64_t room = std::max<int64_t>(manifest.buckets.prompt.back() - prompts[i].length, 0);
      prompts[i].tail = std::clamp<int64_t>(want, 0, room);
      prompts[i].tail_embed = tail_embed.data();
      lengths[i] += prompts[i].tail;
    }
  }
  const DispatchPlan plan = plan_dispatch(lengths, kept, schedule.steps, manifest.buckets, policy, options.tau_pad,
                                          options.short_rows, cost.get());
  clock.dispatch = since(t0);
  t0 = Clock::now();
  std::vector<int64_t> tokens(count * n, special.mask_id), used(count, 0), refreshes(count, 0);
  for (const Group& group : plan.groups) {
    std::vector<Prompt> members;
    std::vector<int64_t> member_kept;
    for (int64_t r : group.rows) members.push_back(prompts[r]), member_kept.push_back(kept[r]);
    const auto t1 = Clock::now();
    Layout layout = group.path == "packed"
                        ? packed_layout(members, member_kept, row_bytes)
                        : padded_layout(members, member_kept, group.prompt_len, group.gen_len, row_bytes);
    clock.packing += since(t1);
    std::optional<StepZeroPrediction> step0;
    std::vector<int64_t> x0;
    std::vector<float> confidence;
    const Decoding decoding = choose(key.gen, manifest);
    if (!zero.x0.empty() && decoding.step_zero_predicts()) {  // the full-depth step zero's prediction of the group's rows
      for (int64_t r : group.rows) {
        x0.insert(x0.end(), zero.x0.begin() + r * n, zero.x0.begin() + (r + 1) * n);
        confidence.insert(confidence.end(), zero.confidence.begin() + r * n, zero.confidence.begin() + (r + 1) * n);
      }
      step0 = StepZeroPrediction{x0.data(), confidence.data(), n};
    }
    LoopSettings loop{decoding.rule, key.gen.block_length, std::nullopt, key.cache, cost.get(), decoding.score};
    if (key.early_stop) loop.stop_id = special.eot_id;
    const Denoised out = denoise(*backend, manifest, layout, schedule, group.rows, step0, loop, &graph_ns, cache_spec);
    for (size_t i = 0; i < group.rows.size(); ++i) {
      const int64_t r = group.rows[i];
      std::copy(out.tokens.begin() + i * out.width, out.tokens.begin() + (i + 1) * out.width, tokens.begin() + r * n);
      used[r] = out.steps[i];
      refreshes[r] = out.refreshes[i];
    }
  }
  clock.denoise = since(t0) - clock.packing;
  t0 = Clock::now();
  std::vector<Result> out(count);
  for (int64_t i = 0; i < count; ++i) {
    Result& res = out[i];
    res.window.assign(tokens.begin() + i * n, tokens.begin() + i * n + kept[i]);
    auto eot = std::find(res.window.begin(), res.window.end(), special.eot_id);
    res.token_ids.assign(res.window.begin(), eot);
    if (std::string why = mask_in_answer(res.token_ids, special.mask_id); !why.empty()) {
      res = Result{}, res.error = why;  // a broken export's "answer": this request fails, as in Python
      continue;
    }
    res.text = detokenizer->decode(res.token_ids);
    res.kept = kept[i], res.steps = used[i], res.gen_length = n, res.refreshes = refreshes[i];
  }
  clock.detokenize = since(t0);
  const double group_graphs = graph_ns.load() * 1e-9;
  for (int64_t i = 0; i < count; ++i) {
    Result& res = out[i];
    res.seconds = clock;
    res.seconds.preprocess = rows[i].seconds;
    res.seconds.graphs = group_graphs + rows[i].graph_ns * 1e-9;
    results[rows[i].index] = std::move(res);
  }
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

std::unique_ptr<Pipeline> Pipeline::open(const std::string& folder, const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->folder = folder;
  impl->options = options;
  check_policy(options.policy);
  if (!(options.tau_pad >= 0 && options.tau_pad <= 1))
    throw config_error("tau_pad must lie in [0, 1], got " + std::to_string(options.tau_pad));
  if (options.short_rows < 0)
    throw config_error("short must be >= 0 (0: no group of short rows), got " + std::to_string(options.short_rows));
  impl->manifest = Manifest::read(folder);
  const Manifest& m = impl->manifest;
  std::vector<std::string> graphs = {"embed", "denoise"};
  if (!m.vision.text_only()) graphs.push_back(m.vision.graph());
  if (!m.seer.full_depth()) graphs.push_back("step_zero");
  // the inputs and outputs this runtime feeds and reads (seer_trt/contracts/graphs.py); another contract is refused here,
  // not at the first request
  const std::vector<std::string> window_inputs = {"prefix_embeds", "gen_ids", "segment_ids", "position_ids"};
  const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> contract = {
      {"embed", {{"input_ids"}, {"embeds"}}},
      {"vision", {{"pixel_values"}, {"image_features", "image_newline"}}},
      {"image_tokens", {{"pixel_values"}, {"image_ids"}}},
      {"denoise", {window_inputs, {"x0", confidence_output(m.graph("denoise")).name, "p_end"}}},
      {"step_zero", {window_inputs, {m.seer.signal == "probe" ? "probe_score" : "sparsity"}}}};
  for (const std::string& g : graphs) {
    const GraphEntry& entry = m.graph(g);
    std::vector<std::string> inputs, outputs;
    for (const auto& t : entry.inputs) inputs.push_back(t.name);
    for (const auto& t : entry.outputs) outputs.push_back(t.name);
    const auto& [want_in, want_out] = contract.at(g);
    if (g == "denoise" && inputs.size() > want_in.size()) inputs.resize(want_in.size());  // then its cache (below)
    bool ok = inputs == want_in;
    for (const auto& o : want_out) ok &= std::find(outputs.begin(), outputs.end(), o) != outputs.end();
    if (!ok) {
      std::string found;
      for (const auto& name : inputs) found += (found.empty() ? "" : ", ") + name;
      throw manifest_error("graph '" + g + "' takes inputs [" + found +
                           "], not the contract this C++ runtime feeds (seer_trt/contracts/graphs.py) or lacks an output it "
                           "reads; rebuild the C++ library from the seer-trt that exported the folder");
    }
  }
  impl->cache_spec = cache_spec(m.graph("denoise"));
  impl->cache = CacheConfig{options.cache, options.refresh_interval, options.forecast_order};
  impl->cache.validate();
  check_cache(impl->cache, impl->cache_spec);
  impl->backend = std::make_unique<Backend>(folder, m, options, graphs);
  impl->detokenizer = std::make_unique<Detokenizer>(
      read_bounded(export_path(folder, m.tokenizer + "/tokenizer.json", "tokenizer", true), folder, "tokenizer",
                   MAX_TOKENIZER_BYTES));
  if (m.seer.tail > 0) {
    std::atomic<int64_t> clock{0};
    impl->tail_embed = embed_token(*impl->backend, m, m.seer.tail_token == "eot" ? m.special.eot_id
                                                                                 : m.special.endoftext_id, &clock);
  }
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

std::vector<Result> Pipeline::generate(const std::vector<Request>& requests, const std::string& policy) {
  Impl& im = *impl_;
  const std::string chosen = policy.empty() ? im.options.policy : policy;
  check_policy(chosen);
  std::vector<Result> results(requests.size());
  std::vector<std::pair<Key, std::vector<Prepared>>> groups;  // in the order of their first request
  std::vector<const Request*> pointers;
  for (const auto& r : requests) pointers.push_back(&r);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const auto start = Clock::now();
    std::atomic<int64_t> graph_ns{0};
    try {
      GenerationConfig gen = im.generation(r);
      PromptEmbeds prompt = embed_prompt(*im.backend, im.manifest, r, &graph_ns);
      Key key{gen, r.window ? 2 : r.seer ? 0 : 1, r.early_stop, im.cache_for(r)};
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
      it->second.push_back({i, std::move(prompt), since(start), graph_ns.load()});
    } catch (const Error& err) {
      results[i].error = err.what();
    } catch (const std::exception& err) {
      results[i].error = std::string("this request could not be prepared (") + err.what() + "); the others are unaffected";
    }
  }
  for (auto& [key, rows] : groups) {
    try {
      im.run(key, pointers, rows, chosen, results);
    } catch (const std::exception& err) {  // a graph failed: this group's requests carry why
      for (const auto& row : rows) results[row.index] = Result{}, results[row.index].error = err.what();
    }
  }
  return results;
}

int64_t Pipeline::image_size() const { return impl_->manifest.vision.image_size; }
int64_t Pipeline::max_tiles() const { return impl_->manifest.vision.max_tiles(); }
int64_t Pipeline::max_prompt_ids() const { return impl_->manifest.buckets.prompt.back(); }
int64_t Pipeline::vocab_size() const { return impl_->manifest.vocab_size; }
std::string Pipeline::ort_version() const { return Backend::version(); }

}  // namespace seer
