// Pipeline: requests in, answers out (seer_trt/runtime/pipeline.py, docs/DESIGN.md "Layout and dependency direction", "Seer, exactly").
//
//     plan:    requests ─► preprocess (embed.cpp) ─► groups by settings
//     execute: per group step zero (step_zero.cpp) ─► boundary (boundary.cpp) ─► schedule (schedule.cpp) ─► rows
//              ─► every group's rows in one loop (denoise.cpp: dispatch.cpp splits, layout.cpp lays out each step's
//                 calls, kv_cache.cpp holds the prompt K/V) ─► detokenize
//
// Requests with the same generation settings (the decoding rule in its one spelling included), mode (Seer, padded,
// oracle window), early stopping and prompt K/V cache policy share a step zero, groups in the order of their first
// request, rows in request order; then every group's rows step in one loop to the end, where rows of different
// settings share graph calls: the same calls as the Python runtime, so the same tokens. A row joins the loop when its
// prompt K/V slot fits the pool (admission by memory); one that can never fit fails alone. A bad request gets its
// error and the others complete. Sessions are shared between threads; every buffer of a call belongs to that call.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unistd.h>

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

constexpr double HOST_KV_SHARE = 0.25;  // of the machine's memory, the pool's default budget (kv_cache.py)

constexpr double MAX_TEMPERATURE = 2.0;  // seer_trt.contracts.config.GenerationConfig.MAX_TEMPERATURE
constexpr size_t MAX_STOP = 4;          // stop sequences a request may hold (seer_trt.serving: OpenAI's limit)

std::string number_text(double v) {  // as Python's repr would show it, near enough for a message
  std::ostringstream out;
  out << std::setprecision(17) << v;
  return out.str();
}

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

// A group started (Impl::start_group): its rows, each ready for the loop, and the stages' seconds.
struct GroupRun {
  std::vector<std::unique_ptr<Row>> rows;  // in the group's order
  Timings clock;
  int64_t step_zero_ns = 0;  // in its step-zero graphs
  std::string error;         // why the group failed (a graph), "" when it did not
};

// The pool's default budget: HOST_KV_SHARE of the machine's physical memory.
int64_t default_kv_budget() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(HOST_KV_SHARE * static_cast<double>(pages * page)) : 0;
}

}  // namespace

struct Pipeline::Impl {
  std::string folder;
  Options options;
  Manifest manifest;
  std::unique_ptr<Backend> backend;
  CacheSpec cache_spec;  // the window graph's cache inputs (none in a 2.0 export)
  CacheConfig cache;     // the policy of requests that choose none
  std::unique_ptr<KVPool> pool;  // the rows' prompt K/V slots, shared by every call (none without a cache)
  std::unique_ptr<Detokenizer> detokenizer;
  std::mutex cost_mutex;
  std::unique_ptr<CostModel> cost;  // measured on the first batch of several rows that needs it
  std::vector<uint8_t> tail_embed;  // [D] the token Seer's end tail holds, embedded at open (seer.tail > 0)

  GenerationConfig generation(const Request& r) const;
  CacheConfig cache_for(const Request& r) const;
  void calibrate_costs();
  // the requests prepared (settings, prompt embeddings) and grouped by settings; a failure is its request's alone
  std::vector<std::pair<Key, std::vector<Prepared>>> plan(const std::vector<Request>& requests,
                                                          std::vector<Result>& results);
  GroupRun start_group(const Key& key, const std::vector<Request>& requests, const std::vector<Prepared>& rows);
  // every started group's rows stepped in one loop to the end, each joining as its K/V slot fits the pool
  void denoise(std::vector<GroupRun>& runs, const std::string& policy, std::atomic<int64_t>* clock);
  std::vector<Result> answers(GroupRun& run, const Key& key, const std::vector<Request>& requests,
                              const std::vector<Prepared>& rows, int64_t loop_ns) const;
  std::string too_large(const Row& row) const;
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
  if (r.temperature) {  // seer_trt.runtime.request.check_settings' bounds and words
    if (!(*r.temperature >= 0 && *r.temperature <= MAX_TEMPERATURE))
      throw input_error("temperature is " + number_text(*r.temperature) + "; expected a number in [0, 2] (0: greedy; "
                        "OpenAI's range)");
    gen.temperature = *r.temperature;
  }
  if (r.seed >= (uint64_t{1} << 63))
    throw input_error("seed is " + std::to_string(r.seed) + "; expected a whole number in [0, 2**63)");
  if (!(r.top_p > 0 && r.top_p <= 1))
    throw input_error("top_p is " + number_text(r.top_p) + "; expected a number in (0, 1] (1: the whole vocabulary)");
  if (r.stop.size() > MAX_STOP)
    throw input_error("stop holds " + std::to_string(r.stop.size()) + " sequences; expected at most " +
                      std::to_string(MAX_STOP) + " (OpenAI's limit)");
  for (const std::string& q : r.stop)
    if (q.empty()) throw input_error("a stop sequence is empty; expected at least one character");
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
  // one window call at each of the calibration's shapes (clipped to the buckets), timed, and the greedy read of its
  // outputs: seer_trt.runtime.costs.calibrate
  const size_t row_bytes = manifest.hidden_size * element_size(manifest.precision);
  const Buckets& bk = manifest.buckets;
  const ConfidenceOutput confidence = confidence_output(manifest.graph("denoise"));
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
    Layout layout =
        padded_layout(std::vector<Prompt>(b, Prompt{zeros.data(), p}), std::vector<int64_t>(b, g), p, g, row_bytes);
    std::vector<int64_t> gen_ids(b * g, manifest.special.mask_id), x0(b * g);
    std::vector<float> conf(b * g);
    NoCache none;
    GraphCall call = backend->call("denoise", &clock);
    call.input("prefix_embeds", layout.prefix_embeds.data(), manifest.precision, {b, p, manifest.hidden_size});
    call.input("gen_ids", gen_ids.data(), "int64", {b, g});
    call.input("segment_ids", layout.segment_ids.data(), "int32", {b, p + g});
    call.input("position_ids", layout.position_ids.data(), "int64", {b, p + g});
    none.bind(call, cache_spec, manifest.precision, b);
    call.output("x0", x0.data(), "int64", {b, g});
    call.output(confidence.name.c_str(), conf.data(), "float32", {b, g});
    double fastest = 1e300;
    for (int64_t k = 0; k <= manifest.cost_calibration.repeats; ++k) {  // the first warms the session
      const auto start = Clock::now();
      call.run();
      if (!confidence.is_log) log_in_place(conf.data(), conf.size());
      if (k) fastest = std::min(fastest, since(start));
    }
    sizes.emplace_back(b, p + g);
    seconds.push_back(fastest);
  }
  cost = std::make_unique<CostModel>(CostModel::fit(sizes, seconds));
}

GroupRun Pipeline::Impl::start_group(const Key& key, const std::vector<Request>& requests,
                                     const std::vector<Prepared>& rows) {
  // step zero batched, boundary (L*), schedule, each row's prefix (its end tail ahead of its prompt), settings and
  // cache policy (SeerPipeline.start_group); no slot reserved yet (the loop reserves it)
  const SpecialTokens& special = manifest.special;
  const int64_t n = key.gen.gen_length, count = static_cast<int64_t>(rows.size());
  const size_t row_bytes = manifest.hidden_size * element_size(manifest.precision);
  GroupRun run;
  std::vector<Prompt> prompts;
  for (const auto& r : rows) prompts.push_back({r.prompt.embeds.data(), r.prompt.length});
  std::vector<int64_t> kept(count, n);
  if (key.mode == 2)
    for (int64_t i = 0; i < count; ++i) kept[i] = *requests[rows[i].index].window;
  const Decoding decoding = choose(key.gen, manifest);
  StepZeroOut zero;
  if (key.mode == 0) {
    std::atomic<int64_t> graph_ns{0};
    auto t0 = Clock::now();
    zero = run_step_zero(*backend, manifest, prompts, n, &graph_ns, cache_spec);
    run.clock.step_zero = since(t0);
    t0 = Clock::now();
    kept = detect(zero.profile, count, n, manifest.seer);
    run.clock.boundary = since(t0);
    run.step_zero_ns = graph_ns.load();
  }
  const auto t0 = Clock::now();
  const Schedule schedule = plan_schedule(key.gen, kept, *decoding.counts);
  // Seer's end tail (SeerPipeline.tails): ceil(tail * (N - L*)) committed end tokens after each cut row's window,
  // none for a row kept whole (the padded loop), no more than the largest prompt bucket leaves room for
  if (manifest.seer.tail > 0) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t want = static_cast<int64_t>(std::ceil(manifest.seer.tail * static_cast<double>(n - kept[i])));
      const int64_t room = std::max<int64_t>(manifest.buckets.prompt.back() - prompts[i].length, 0);
      prompts[i].tail = std::clamp<int64_t>(want, 0, room);
      prompts[i].tail_embed = tail_embed.data();
    }
  }
  const auto settings = std::make_shared<const RowSettings>(RowSettings{
      decoding, key.early_stop ? std::optional<int64_t>(special.eot_id) : std::nullopt, key.cache,
      key.gen.block_length});
  const bool step0 = !zero.x0.empty() && decoding.step_zero_predicts();
  const size_t total = static_cast<size_t>(schedule.num_steps);
  for (int64_t i = 0; i < count; ++i) {  // once per request
    const size_t from = i * total, steps = static_cast<size_t>(schedule.steps[i]);
    std::vector<float> fraction;
    if (!schedule.fraction.empty())
      fraction.assign(schedule.fraction.begin() + from, schedule.fraction.begin() + from + steps);
    const Request& request = requests[rows[i].index];
    auto row = std::make_unique<Row>(
        settings, with_tail(prompts[i], kept[i], row_bytes),
        std::vector<int64_t>(schedule.transfer.begin() + from, schedule.transfer.begin() + from + steps),
        std::vector<int64_t>(schedule.block_end.begin() + from, schedule.block_end.begin() + from + steps),
        std::move(fraction), kept[i], special.mask_id);
    row->seed = request.seed, row->top_p = request.top_p;
    if (step0) {  // the full-depth step zero's prediction of the row's window
      row->step0_x0.assign(zero.x0.begin() + i * n, zero.x0.begin() + i * n + kept[i]);
      row->step0_confidence.assign(zero.confidence.begin() + i * n, zero.confidence.begin() + i * n + kept[i]);
    }
    run.rows.push_back(std::move(row));
  }
  run.clock.dispatch = since(t0);
  return run;
}

std::string Pipeline::Impl::too_large(const Row& row) const {
  const int64_t snapshots = row.cache.config.snapshots();
  return "this request's prompt K/V takes " + std::to_string(pool->slot_bytes(row.prefix.size(), snapshots)) +
         " bytes (" + std::to_string(row.prefix.size()) + " positions x " + std::to_string(snapshots) +
         " snapshot(s)) and the K/V pool's budget is " + std::to_string(pool->budget()) + " bytes, " +
         std::to_string(pool->used()) + " of them held; raise the budget (kv_budget) or send cache none";
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
  if (m.graphs.count("denoise_logits")) graphs.push_back("denoise_logits");  // sampled requests' window graph
  // the inputs and outputs this runtime feeds and reads (seer_trt/contracts/graphs.py); another contract is refused here,
  // not at the first request
  const std::vector<std::string> window_inputs = {"prefix_embeds", "gen_ids", "segment_ids", "position_ids"};
  const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> contract = {
      {"embed", {{"input_ids"}, {"embeds"}}},
      {"vision", {{"pixel_values"}, {"image_features", "image_newline"}}},
      {"image_tokens", {{"pixel_values"}, {"image_ids"}}},
      {"denoise", {window_inputs, {"x0", confidence_output(m.graph("denoise")).name, "p_end"}}},
      {"denoise_logits", {window_inputs, {"logits"}}},
      {"step_zero", {window_inputs, {m.seer.signal == "probe" ? "probe_score" : "sparsity"}}}};
  for (const std::string& g : graphs) {
    const GraphEntry& entry = m.graph(g);
    std::vector<std::string> inputs, outputs;
    for (const auto& t : entry.inputs) inputs.push_back(t.name);
    for (const auto& t : entry.outputs) outputs.push_back(t.name);
    const auto& [want_in, want_out] = contract.at(g);
    if ((g == "denoise" || g == "denoise_logits") && inputs.size() > want_in.size())
      inputs.resize(want_in.size());  // then its cache (below)
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
  if (options.kv_budget < -1)
    throw config_error("K/V budget " + std::to_string(options.kv_budget) +
                       ": expected a whole number of bytes >= 0 (-1: a quarter of the machine's memory)");
  impl->cache = CacheConfig{options.cache, options.refresh_interval, options.forecast_order};
  impl->cache.validate();
  check_cache(impl->cache, impl->cache_spec);
  impl->backend = std::make_unique<Backend>(folder, m, options, graphs);
  if (impl->cache_spec.enabled) {
    impl->pool = std::make_unique<KVPool>(KVGeometry::of(impl->cache_spec, m.graph("denoise").precision),
                                          options.kv_budget < 0 ? default_kv_budget() : options.kv_budget);
  }
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

std::vector<std::pair<Key, std::vector<Prepared>>> Pipeline::Impl::plan(const std::vector<Request>& requests,
                                                                       std::vector<Result>& results) {
  std::vector<std::pair<Key, std::vector<Prepared>>> groups;  // in the order of their first request
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const auto start = Clock::now();
    std::atomic<int64_t> graph_ns{0};
    try {
      GenerationConfig gen = generation(r);
      PromptEmbeds prompt = embed_prompt(*backend, manifest, r, &graph_ns);
      Key key{gen, r.window ? 2 : r.seer ? 0 : 1, r.early_stop, cache_for(r)};
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
      it->second.push_back({i, std::move(prompt), since(start), graph_ns.load()});
    } catch (const Error& err) {
      results[i].error = err.what();
    } catch (const std::exception& err) {
      results[i].error =
          std::string("this request could not be prepared (") + err.what() + "); the others are unaffected";
    }
  }
  return groups;
}

void Pipeline::Impl::denoise(std::vector<GroupRun>& runs, const std::string& policy, std::atomic<int64_t>* clock) {
  std::vector<Row*> waiting;  // every group's rows, in order
  for (const auto& run : runs)
    for (const auto& row : run.rows) waiting.push_back(row.get());
  try {
    Loop loop(LoopSettings{*backend, manifest, cache_spec, policy, options.tau_pad, options.short_rows, cost.get(),
                           pool.get(), clock});
    size_t next = 0;
    while (next < waiting.size() || !loop.rows().empty()) {
      next += loop.add(waiting, next);  // in order, as their K/V slots fit the pool
      if (next < waiting.size() && loop.rows().empty()) {  // nothing will give a slot back: the head can never fit
        waiting[next]->error = too_large(*waiting[next]);
        ++next;
      }
      loop.step();
      loop.retire();
    }
  } catch (const std::exception& err) {  // a graph failed mid-loop: the rows that stepped with it carry why
    for (auto& run : runs)
      if (run.error.empty()) run.error = err.what();
  }
}

std::vector<Result> Pipeline::Impl::answers(GroupRun& run, const Key& key, const std::vector<Request>& requests,
                                            const std::vector<Prepared>& rows, int64_t loop_ns) const {
  const auto t0 = Clock::now();
  std::vector<Result> out(rows.size());
  for (size_t i = 0; i < out.size(); ++i) {
    Result& res = out[i];
    const std::string& error = run.error.empty() ? run.rows[i]->error : run.error;
    if (!error.empty()) {
      res.error = error;
      continue;
    }
    const Row& row = *run.rows[i];
    res.window = row.x;
    res.token_ids.assign(res.window.begin(), std::find(res.window.begin(), res.window.end(), manifest.special.eot_id));
    if (std::string why = mask_in_answer(res.token_ids, manifest.special.mask_id); !why.empty()) {
      res = Result{}, res.error = why;  // a broken export's "answer": this request fails, as in Python
      continue;
    }
    res.text = detokenizer->decode(res.token_ids);
    const std::vector<std::string>& stop = requests[rows[i].index].stop;
    if (res.text && !stop.empty()) res.text = cut_at_stop(*res.text, stop);
    res.kept = row.kept(), res.steps = row.used, res.gen_length = key.gen.gen_length, res.refreshes = row.refreshes;
  }
  run.clock.detokenize = since(t0);
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].ok()) continue;
    out[i].seconds = run.clock;
    out[i].seconds.preprocess = rows[i].seconds;
    out[i].seconds.graphs = (run.step_zero_ns + loop_ns + rows[i].graph_ns) * 1e-9;
  }
  return out;
}

std::vector<Result> Pipeline::generate(const std::vector<Request>& requests, const std::string& policy) {
  Impl& im = *impl_;
  const std::string chosen = policy.empty() ? im.options.policy : policy;
  check_policy(chosen);
  std::vector<Result> results(requests.size());
  auto groups = im.plan(requests, results);
  size_t rows = 0;
  for (const auto& g : groups) rows += g.second.size();
  if (chosen == "cost_model" && rows > 1) {  // rows of any groups share calls: the step costs come first
    std::lock_guard<std::mutex> lock(im.cost_mutex);
    if (!im.cost) im.calibrate_costs();
  }
  std::vector<GroupRun> runs(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    try {
      runs[g] = im.start_group(groups[g].first, requests, groups[g].second);
    } catch (const std::exception& err) {  // a graph failed: this group's requests carry why
      runs[g] = GroupRun{};
      runs[g].error = err.what();
    }
  }
  std::atomic<int64_t> loop_ns{0};
  const auto t0 = Clock::now();
  im.denoise(runs, chosen, &loop_ns);  // every group's rows in one loop to the end
  const double denoise_s = since(t0);
  for (size_t g = 0; g < groups.size(); ++g) {
    runs[g].clock.denoise = denoise_s;
    std::vector<Result> out = im.answers(runs[g], groups[g].first, requests, groups[g].second, loop_ns.load());
    for (size_t i = 0; i < out.size(); ++i) results[groups[g].second[i].index] = std::move(out[i]);
  }
  return results;
}

int64_t Pipeline::image_size() const { return impl_->manifest.vision.image_size; }
int64_t Pipeline::max_tiles() const { return impl_->manifest.vision.max_tiles(); }
int64_t Pipeline::max_prompt_ids() const { return impl_->manifest.buckets.prompt.back(); }
int64_t Pipeline::vocab_size() const { return impl_->manifest.vocab_size; }
std::string Pipeline::ort_version() const { return Backend::version(); }

}  // namespace seer
