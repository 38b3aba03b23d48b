#include "manifest.hpp"

#include <cstdio>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>
#include <sstream>

namespace seer {
namespace {

using nlohmann::json;

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) throw manifest_error(where + " is not a JSON object; re-export with seer-export");
  auto it = obj.find(key);
  if (it == obj.end())
    throw manifest_error(where + " lacks '" + key + "'; the manifest is incomplete, re-export it with seer-export");
  return *it;
}

template <typename T>
T get(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  try {
    if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw json::type_error::create(302, "not a whole number", &v);
    }
    return v.get<T>();
  } catch (const json::exception&) {
    throw manifest_error(where + "." + key + " is " + v.dump() + ", of the wrong type; re-export with seer-export");
  }
}

template <typename T>
T get_or(const json& obj, const char* key, T fallback, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  return get<T>(obj, key, where);
}

std::vector<int64_t> sizes(const json& obj, const char* key, const std::string& where) {
  auto values = get<std::vector<int64_t>>(obj, key, where);
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < 1 || (i && values[i] <= values[i - 1]))
      throw manifest_error(where + "." + key + " must be increasing positive sizes, got " + obj[key].dump());
  if (values.empty()) throw manifest_error(where + "." + key + " is empty; re-export with seer-export");
  return values;
}

TensorSpec tensor(const json& t, const std::string& where) {
  TensorSpec spec{get<std::string>(t, "name", where), get<std::string>(t, "dtype", where), {}};
  for (const json& a : field(t, "shape", where)) {
    if (a.is_string()) spec.shape.push_back({a.get<std::string>(), -1});
    else if (a.is_number_integer()) spec.shape.push_back({"", a.get<int64_t>()});
    else throw manifest_error(where + ": axis " + a.dump() + " is neither a name nor a size; re-export");
  }
  return spec;
}

}  // namespace

const TensorSpec* GraphEntry::output(const std::string& n) const {
  for (const auto& t : outputs)
    if (t.name == n) return &t;
  return nullptr;
}

void GenerationConfig::validate() const {
  for (auto [name, value] : {std::pair{"gen_length", gen_length}, {"steps", steps}, {"block_length", block_length}})
    if (value < 1) throw config_error(std::string(name) + " must be a whole number >= 1, got " + std::to_string(value));
  if (gen_length % block_length)
    throw config_error("gen_length " + std::to_string(gen_length) + " is not a multiple of block_length " +
                       std::to_string(block_length) + "; choose a block_length that divides gen_length");
  if (steps % num_blocks())
    throw config_error("steps " + std::to_string(steps) + " is not a multiple of the number of blocks " +
                       std::to_string(num_blocks()) + " (gen_length " + std::to_string(gen_length) +
                       " / block_length " + std::to_string(block_length) + "); choose steps divisible by it");
}

bool GenerationConfig::operator<(const GenerationConfig& o) const {
  return std::tie(gen_length, steps, block_length, temperature, remasking) <
         std::tie(o.gen_length, o.steps, o.block_length, o.temperature, o.remasking);
}

bool GenerationConfig::operator==(const GenerationConfig& o) const { return !(*this < o) && !(o < *this); }

const GraphEntry& Manifest::graph(const std::string& name) const {
  auto it = graphs.find(name);
  if (it == graphs.end()) {
    std::string have;
    for (const auto& [n, _] : graphs) have += (have.empty() ? "" : ", ") + n;
    throw manifest_error("this export has no '" + name + "' graph (it has " + have +
                         "); re-export with seer-export --graphs ... " + name);
  }
  return it->second;
}

Manifest Manifest::read(const std::string& folder) {
  const std::string path = folder + "/manifest.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::ifstream dir(folder);
    const std::string found = dir ? "it holds no manifest.json" : "it does not exist";
    throw manifest_error(folder + " is not an export folder (" + found + "); create one with `seer-export --out " +
                         folder + "`");
  }
  json data;
  try {
    data = json::parse(in);
  } catch (const json::exception& err) {
    throw manifest_error(path + " is not readable JSON (" + err.what() + "); re-export with seer-export");
  }
  if (!data.is_object()) throw manifest_error(path + " holds no JSON object; re-export with seer-export");
  Manifest m;
  const json& version = field(data, "schema_version", path);
  m.schema_version = version.is_string() ? version.get<std::string>() : version.dump();
  int major = -1;
  if (std::sscanf(m.schema_version.c_str(), "%d.", &major) != 1 || m.schema_version.find('.') == std::string::npos)
    throw manifest_error(path + ": schema_version '" + m.schema_version +
                         "' is not 'MAJOR.MINOR' (expected 2.x); re-export with seer-export");
  if (major != SCHEMA_MAJOR)
    throw manifest_error(path + ": schema_version " + m.schema_version +
                         " is not supported (this runtime reads 2.x); " +
                         (major > SCHEMA_MAJOR ? "upgrade seer-trt, or re-export" : "re-export it") +
                         " with this version's seer-export");

  const json& model = field(data, "model", path);
  m.hidden_size = get<int64_t>(model, "hidden_size", "manifest model");
  m.vocab_size = get<int64_t>(model, "vocab_size", "manifest model");

  const json& vision = field(data, "vision", path);
  m.vision.image_size = get<int64_t>(vision, "image_size", "manifest vision");
  m.vision.patch_size = get<int64_t>(vision, "patch_size", "manifest vision");
  m.vision.tokens_per_tile = get<int64_t>(vision, "tokens_per_tile", "manifest vision");
  m.vision.image_aspect_ratio = get<std::string>(vision, "image_aspect_ratio", "manifest vision");
  m.vision.newline = get<std::string>(vision, "newline", "manifest vision");
  if (vision.contains("anyres_max_tiles") && !vision["anyres_max_tiles"].is_null())
    m.vision.anyres_max_tiles = get<int64_t>(vision, "anyres_max_tiles", "manifest vision");

  const json& special = field(data, "special_tokens", path);
  const std::string ws = "manifest special_tokens";
  m.special = {get<int64_t>(special, "mask_id", ws),         get<int64_t>(special, "endoftext_id", ws),
               get<int64_t>(special, "startoftext_id", ws),  get<int64_t>(special, "eot_id", ws),
               get<int64_t>(special, "start_header_id", ws), get<int64_t>(special, "end_header_id", ws)};
  m.tokenizer = get<std::string>(data, "tokenizer", path);

  const json& seer = field(data, "seer", path);
  const std::string wseer = "manifest seer";
  SeerConfig& s = m.seer;
  s.signal = get_or<std::string>(seer, "signal", s.signal, wseer);
  s.statistic = get_or<std::string>(seer, "statistic", s.statistic, wseer);
  s.probe_layer = get_or<int64_t>(seer, "probe_layer", s.probe_layer, wseer);
  s.direction = get_or<std::string>(seer, "direction", s.direction, wseer);
  s.tau_jump = get_or<double>(seer, "tau_jump", s.tau_jump, wseer);
  s.gamma = get_or<double>(seer, "gamma", s.gamma, wseer);
  s.threshold = get_or<double>(seer, "threshold", s.threshold, wseer);
  s.window = get_or<int64_t>(seer, "window", s.window, wseer);
  s.margin = get_or<int64_t>(seer, "margin", s.margin, wseer);
  s.label = get_or<std::string>(seer, "label", s.label, wseer);
  s.detector = get_or<std::string>(seer, "detector", s.signal == "mlp_sparsity" ? "jump" : "threshold", wseer);
  if (s.signal != "mlp_sparsity" && s.signal != "probe" && s.signal != "end_token_prob")
    throw manifest_error(path + ": seer.signal '" + s.signal +
                         "' is not one of mlp_sparsity, probe, end_token_prob; re-export with seer-export");
  if (s.detector != "jump" && s.detector != "threshold")
    throw manifest_error(path + ": seer.detector '" + s.detector + "' is not one of jump, threshold");
  if (s.direction != "up" && s.direction != "down")
    throw manifest_error(path + ": seer.direction '" + s.direction + "' is not one of up, down");
  if (s.window < 1 || s.margin < 0 || !(s.tau_jump > 0) || !(s.gamma >= 0) || !(s.threshold > 0 && s.threshold < 1))
    throw manifest_error(path + ": seer detector settings out of range (window >= 1, margin >= 0, tau_jump > 0, "
                         "gamma >= 0, 0 < threshold < 1); re-calibrate with seer-calibrate");

  const json& gen = field(data, "generation", path);
  const std::string wg = "manifest generation";
  m.generation = {get<int64_t>(gen, "gen_length", wg), get<int64_t>(gen, "steps", wg),
                  get<int64_t>(gen, "block_length", wg), get_or<double>(gen, "temperature", 0.0, wg),
                  get_or<std::string>(gen, "remasking", "low_confidence", wg)};
  try {
    m.generation.validate();
  } catch (const Error& err) {
    throw manifest_error(path + ": " + err.what());
  }
  m.precision = get<std::string>(data, "precision", path);
  if (m.precision != "float32" && m.precision != "float16")
    throw manifest_error(path + ": precision '" + m.precision + "' is not float32 or float16; re-export");

  const json& graphs = field(data, "graphs", path);
  if (!graphs.is_object()) throw manifest_error(path + ": graphs is not a JSON object; re-export with seer-export");
  for (const auto& [name, g] : graphs.items()) {
    const std::string where = "manifest graphs." + name;
    GraphEntry entry{name, get<std::string>(g, "file", where), get<std::string>(g, "precision", where), {}, {}};
    for (const json& t : field(g, "inputs", where)) entry.inputs.push_back(tensor(t, where));
    for (const json& t : field(g, "outputs", where)) entry.outputs.push_back(tensor(t, where));
    m.graphs.emplace(name, std::move(entry));
  }
  const json& buckets = field(data, "buckets", path);
  m.buckets = {sizes(buckets, "batch", "manifest buckets"), sizes(buckets, "prompt", "manifest buckets"),
               sizes(buckets, "answer", "manifest buckets")};
  if (data.contains("weights") && !data["weights"].is_null()) {
    const json& w = data["weights"];
    m.weights = WeightsInfo{get<std::string>(w, "file", "manifest weights"),
                            get<std::string>(w, "index", "manifest weights"),
                            get<int64_t>(w, "size_bytes", "manifest weights")};
  }
  return m;
}

}  // namespace seer
