// The C ABI (seer/seer_c.h): exceptions stop here and become NULL + seer_last_error().
#include "seer/seer_c.h"

#include <algorithm>
#include <cstddef>
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

// seer_request's sizes: ABI 5's (the first with struct_size; every field of it is read) and a bound past which a
// struct_size is no size at all (a caller built before ABI 5, whose first member is the prompt_ids pointer)
constexpr size_t FIRST_SIZE = offsetof(seer_request, num_stop) + sizeof(size_t);
constexpr size_t MAX_SIZE = 4096;

// The requests' own struct (their struct_size and stride), read into this library's seer_request: the fields inside
// it as given, the rest their default (0); refused when the size cannot be one, or when a newer caller sets a field
// this library lacks (copy_struct_from_user's rule, Linux's openat2 / clone3).
std::vector<seer_request> read_requests(const seer_request* requests, size_t count) {
  std::vector<seer_request> out(count);
  if (!count) return out;
  const size_t size = requests->struct_size;
  if (size < FIRST_SIZE || size > MAX_SIZE || size % alignof(seer_request))
    throw seer::Error(seer::Error::Kind::Config,
                      "seer_request.struct_size is " + std::to_string(size) + "; expected sizeof(seer_request), " +
                      std::to_string(sizeof(seer_request)) + " bytes at C ABI " + std::to_string(SEER_C_ABI_VERSION) +
                      " (at least " + std::to_string(FIRST_SIZE) + "): a caller built against seer_c.h before ABI 5 "
                      "has no struct_size; rebuild it against this header and start each request from "
                      "seer_request_defaults()");
  const auto* bytes = reinterpret_cast<const unsigned char*>(requests);
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* at = bytes + i * size;
    size_t own = 0;
    std::memcpy(&own, at, sizeof own);
    if (own != size)
      throw seer::Error(seer::Error::Kind::Config,
                        "request " + std::to_string(i) + "'s struct_size is " + std::to_string(own) + ", request 0's " +
                        std::to_string(size) + "; the requests of one call are one struct, laid out at its size");
    for (size_t b = sizeof(seer_request); b < size; ++b)
      if (at[b])
        throw seer::Error(seer::Error::Kind::Config,
                          "request " + std::to_string(i) + " sets a field at byte " + std::to_string(b) +
                          " of its " + std::to_string(size) + "-byte seer_request, past the " +
                          std::to_string(sizeof(seer_request)) + " bytes this library (C ABI " +
                          std::to_string(SEER_C_ABI_VERSION) + ") reads; use a libseer as new as the header the "
                          "caller was built against, or leave that field 0");
    std::memcpy(&out[i], at, std::min(size, sizeof(seer_request)));
  }
  return out;
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
    const std::vector<seer_request> given = read_requests(requests, count);
    std::vector<seer::Request> batch(count);
    for (size_t i = 0; i < count; ++i) {
      const seer_request& c = given[i];
      seer::Request& r = batch[i];
      if (c.prompt_len && !c.prompt_ids) throw seer::Error(seer::Error::Kind::Input, "prompt_ids is NULL");
      r.prompt_ids.assign(c.prompt_ids, c.prompt_ids + c.prompt_len);
      const seer_image& image = c.image;
      if (image.pixel_values && image.tiles > 0) {
        const size_t s = static_cast<size_t>(pipeline->pipeline->image_size());
        r.pixel_values.assign(image.pixel_values, image.pixel_values + image.tiles * 3 * s * s);
      }
      r.tiles = image.pixel_values ? image.tiles : 0;
      r.grid_cols = image.grid_cols, r.grid_rows = image.grid_rows;
      r.image_width = image.width, r.image_height = image.height;
      if (c.gen_length) r.gen_length = c.gen_length;
      if (c.steps) r.steps = c.steps;
      if (c.block_length) r.block_length = c.block_length;
      if (c.window) r.window = c.window;
      if (c.seer != 0 && c.seer != 1 && c.seer != SEER_OFF)
        throw seer::Error(seer::Error::Kind::Input, "seer is " + std::to_string(c.seer) +
                                                        "; expected 0 or 1 (Seer on) or SEER_OFF (-1, the padded "
                                                        "baseline)");
      r.seer = c.seer != SEER_OFF;
      r.early_stop = c.early_stop != 0;
      if (c.cache) r.cache = std::string(c.cache);
      if (c.refresh_interval) r.refresh_interval = c.refresh_interval;
      if (c.decoding) r.decoding = std::string(c.decoding);
      if (c.remasking) r.remasking = std::string(c.remasking);
      if (!(c.temperature < 0)) r.temperature = c.temperature;  // NaN reaches the request's check
      r.seed = c.seed;
      r.top_p = c.top_p == 0 ? 1.0 : c.top_p;
      if (c.num_stop && !c.stop) throw seer::Error(seer::Error::Kind::Input, "stop is NULL with num_stop > 0");
      for (size_t k = 0; k < c.num_stop; ++k) {
        if (!c.stop[k]) throw seer::Error(seer::Error::Kind::Input, "stop[" + std::to_string(k) + "] is NULL");
        r.stop.emplace_back(c.stop[k]);
      }
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
