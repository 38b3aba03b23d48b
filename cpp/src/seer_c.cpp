// The C ABI (seer/seer_c.h): exceptions stop here and become NULL + seer_last_error().
#include "seer/seer_c.h"

#include <cstring>
#include <memory>
#include <vector>
#include <string>

#include "seer/seer.hpp"

struct seer_pipeline {
  std::unique_ptr<seer::Pipeline> pipeline;
};

namespace {

thread_local std::string last_error;

struct Payload {  // what a seer_results points into
  std::vector<seer_result> items;
  std::vector<seer::Result> source;
};

struct Owned {  // standard layout, its seer_results first: the pointer handed out is the block's own
  seer_results results;
  Payload* payload;
};

int64_t whole(const std::string& key, const std::string& value) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty())
    throw seer::Error(seer::Error::Kind::Config, "option " + key + " is '" + value + "'; expected a whole number");
  return v;
}

double number(const std::string& key, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty())
    throw seer::Error(seer::Error::Kind::Config, "option " + key + " is '" + value + "'; expected a number");
  return v;
}

}  // namespace

extern "C" {

int seer_abi_version(void) { return SEER_C_ABI_VERSION; }

const char* seer_last_error(void) { return last_error.c_str(); }

seer_pipeline* seer_open(const char* folder, const char* const* keys, const char* const* values, size_t n) {
  last_error.clear();
  try {
    if (!folder) throw seer::Error(seer::Error::Kind::Config, "folder is NULL; pass the export folder's path");
    seer::Options o;
    for (size_t i = 0; i < n; ++i) {
      if (!keys || !values || !keys[i] || !values[i])
        throw seer::Error(seer::Error::Kind::Config, "option " + std::to_string(i) + " is NULL");
      const std::string k = keys[i], v = values[i];
      if (k == "ort_library") o.ort_library = v;
      else if (k == "provider") o.provider = v;
      else if (k == "device_id") o.device_id = static_cast<int>(whole(k, v));
      else if (k == "threads") o.threads = static_cast<int>(whole(k, v));
      else if (k == "policy") o.policy = v;
      else if (k == "tau_pad") o.tau_pad = number(k, v);
      else if (k == "short") o.short_rows = static_cast<int>(whole(k, v));
      else if (k == "share_weights") o.share_weights = whole(k, v) != 0;
      else if (k == "cache") o.cache = v;
      else if (k == "kv_budget") o.kv_budget = whole(k, v);
      else if (k == "refresh_interval") o.refresh_interval = whole(k, v);
      else if (k == "forecast_order") o.forecast_order = whole(k, v);
      else
        throw seer::Error(seer::Error::Kind::Config, "unknown option '" + k + "'; expected ort_library, provider, "
                                                     "device_id, threads, policy, tau_pad, short, share_weights, "
                                                     "cache, refresh_interval, forecast_order, kv_budget");
    }
    return new seer_pipeline{seer::Pipeline::open(folder, o)};
  } catch (const std::exception& err) {
    last_error = err.what();
    return nullptr;
  }
}

seer_results* seer_generate(seer_pipeline* pipeline, const seer_request* requests, size_t count, const char* policy) {
  last_error.clear();
  try {
    if (!pipeline) throw seer::Error(seer::Error::Kind::Config, "pipeline is NULL; open one with seer_open");
    if (!requests && count) throw seer::Error(seer::Error::Kind::Config, "requests is NULL");
    std::vector<seer::Request> batch(count);
    for (size_t i = 0; i < count; ++i) {
      const seer_request& c = requests[i];
      seer::Request& r = batch[i];
      if (c.prompt_len && !c.prompt_ids) throw seer::Error(seer::Error::Kind::Input, "prompt_ids is NULL");
      r.prompt_ids.assign(c.prompt_ids, c.prompt_ids + c.prompt_len);
      if (c.pixel_values && c.tiles > 0) {
        const size_t s = static_cast<size_t>(pipeline->pipeline->image_size());
        r.pixel_values.assign(c.pixel_values, c.pixel_values + c.tiles * 3 * s * s);
      }
      r.tiles = c.pixel_values ? c.tiles : 0;
      r.grid_cols = c.grid_cols, r.grid_rows = c.grid_rows, r.image_width = c.image_width, r.image_height = c.image_height;
      if (c.gen_length) r.gen_length = c.gen_length;
      if (c.steps) r.steps = c.steps;
      if (c.block_length) r.block_length = c.block_length;
      if (c.window) r.window = c.window;
      r.seer = !c.no_seer;
      r.early_stop = c.early_stop != 0;
      if (c.cache) r.cache = std::string(c.cache);
      if (c.refresh_interval) r.refresh_interval = c.refresh_interval;
      if (c.decoding) r.decoding = std::string(c.decoding);
      if (c.remasking) r.remasking = std::string(c.remasking);
    }
    auto payload = std::make_unique<Payload>();
    payload->source = pipeline->pipeline->generate(batch, policy ? policy : "");
    payload->items.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const seer::Result& r = payload->source[i];
      seer_result& c = payload->items[i];
      c.token_ids = r.token_ids.data(), c.num_tokens = r.token_ids.size();
      c.window = r.window.data(), c.window_len = r.window.size();
      c.kept = r.kept, c.steps = r.steps, c.gen_length = r.gen_length;
      const seer::Timings& t = r.seconds;
      const double seconds[SEER_NUM_TIMINGS] = {t.preprocess, t.step_zero, t.boundary,   t.dispatch,
                                                t.packing,    t.denoise,   t.detokenize, t.graphs};
      std::memcpy(c.seconds, seconds, sizeof seconds);
      c.text = r.text ? r.text->c_str() : nullptr;
      c.error = r.ok() ? nullptr : r.error.c_str();
      c.refreshes = r.refreshes;
    }
    Owned* owned = new Owned{{count, payload->items.data()}, payload.release()};
    return &owned->results;
  } catch (const std::exception& err) {
    last_error = err.what();
    return nullptr;
  }
}

void seer_results_free(seer_results* results) {
  Owned* owned = reinterpret_cast<Owned*>(results);  // NULL stays NULL
  if (owned) delete owned->payload;
  delete owned;
}

void seer_close(seer_pipeline* pipeline) { delete pipeline; }

}  // extern "C"
