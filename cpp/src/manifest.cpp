#include "manifest.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>
#include <sstream>

namespace seer {

std::string export_path(const std::string& folder, const std::string& name, const std::string& entry, bool regular,
                        std::uintmax_t limit) {
  namespace fs = std::filesystem;
  const std::string shown = "export " + folder + ": manifest entry " + entry;
  const fs::path rel(name);
  bool up = false;
  for (const auto& part : rel) up = up || part == "..";
  if (name.empty() || name.find('\0') != std::string::npos || rel.is_absolute() || rel.has_root_name() || up)
    throw manifest_error(shown + " is \"" + name.substr(0, 80) + "\", a path outside the export folder; an export " +
                         "reads only files inside its own folder (re-export with seer-export)");
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(fs::path(folder), ec);
  const fs::path path = fs::weakly_canonical(root / rel, ec);
  if (ec) throw manifest_error(shown + " (" + name.substr(0, 80) + ") cannot be resolved (" + ec.message() + ")");
  const auto [end, _] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
  if (end != root.end())
    throw manifest_error(shown + " (" + name.substr(0, 80) + ") resolves through a symbolic link to a file outside " +
                         "the export folder; an export reads only files inside its own folder (re-export with " +
                         "seer-export)");
  if (regular) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      throw manifest_error("export " + folder + ": " + entry + " " + path.filename().string() + " is missing; " +
                           "re-export with seer-export --out " + folder);
    if (!S_ISREG(st.st_mode))
      throw manifest_error("export " + folder + ": " + entry + " " + path.filename().string() + " is not a regular " +
                           "file (a FIFO, device, socket or folder); re-export with seer-export");
    if (limit && static_cast<std::uintmax_t>(st.st_size) > limit)
      throw manifest_error("export " + folder + ": " + entry + " " + path.filename().string() + " is " +
                           std::to_string(st.st_size) + " bytes, more than the " + std::to_string(limit) +
                           " such a file may be; re-export with seer-export");
  }
  return path.string();
}

std::string read_bounded(const std::string& path, const std::string& folder, const std::string& entry,
                         std::uintmax_t limit) {
  const std::string name = std::filesystem::path(path).filename().string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw manifest_error("export " + folder + ": " + entry + " " + name + " cannot be opened (" +
                                   std::strerror(errno) + "); re-export with seer-export --out " + folder);
  struct stat st {};
  std::string out;
  std::string why;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = " is not a regular file (a FIFO, device, socket or folder)";
  } else if (static_cast<std::uintmax_t>(st.st_size) > limit) {
    why = " is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(limit) +
          " such a file may be";
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
  }
  ::close(fd);
  if (!why.empty()) throw manifest_error("export " + folder + ": " + entry + " " + name + why +
                                         "; re-export with seer-export");
  return out;
}

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

// what one call can hold (Python: seer_trt.contracts.profiles.MAX_BUCKET): past it, it would be allocated first
constexpr int64_t MAX_BUCKET_ROWS = 4096, MAX_BUCKET_PROMPT = 1 << 20, MAX_BUCKET_ANSWER = 1 << 16;

std::vector<int64_t> sizes(const json& obj, const char* key, const std::string& where) {
  auto values = get<std::vector<int64_t>>(obj, key, where);
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < 1 || (i && values[i] <= values[i - 1]))
      throw manifest_error(where + "." + key + " must be increasing positive sizes, got " + obj[key].dump());
  if (values.empty()) throw manifest_error(where + "." + key + " is empty; re-export with seer-export");
  const int64_t most = std::strcmp(key, "batch") == 0    ? MAX_BUCKET_ROWS
                       : std::strcmp(key, "prompt") == 0 ? MAX_BUCKET_PROMPT
                                                          : MAX_BUCKET_ANSWER;
  if (values.size() > 64 || values.back() > most)
    throw manifest_error(where + "." + key + ": at most 64 sizes of at most " + std::to_string(most) + ", got " +
                         std::to_string(values.size()) + " up to " + std::to_string(values.back()) +
                         "; re-export with seer-export");
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

bool python_space(char c) { return std::strchr(" \t\n\v\f\r\x1c\x1d\x1e\x1f", c) && c != '\0'; }

std::string strip(const std::string& text) {  // str.strip() on the ASCII whitespace str.isspace() names
  size_t begin = 0, end = text.size();
  while (begin < end && python_space(text[begin])) ++begin;
  while (end > begin && python_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

// Python's float(text): its grammar ([sign] digits with single underscores between them, an optional point and
// exponent; or inf, infinity, nan in any case), surrounding whitespace allowed. False when float() would raise.
bool python_float(const std::string& text, double& value) {
  const std::string t = strip(text);
  size_t i = 0;
  const bool negative = i < t.size() && t[i] == '-';
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  std::string lower;
  for (size_t k = i; k < t.size(); ++k) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(t[k])));
  if (lower == "inf" || lower == "infinity" || lower == "nan") {
    value = lower == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    if (negative) value = -value;
    return true;
  }
  std::string plain = t.substr(0, i);  // the number without its underscores, for strtod
  auto digits = [&]() {                 // digit (["_"] digit)*: how many digits were read
    size_t count = 0;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
      plain += t[i++], ++count;
      if (i + 1 < t.size() && t[i] == '_' && std::isdigit(static_cast<unsigned char>(t[i + 1]))) ++i;
    }
    return count;
  };
  size_t mantissa = digits();
  if (i < t.size() && t[i] == '.') plain += t[i++], mantissa += digits();
  if (!mantissa) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    plain += t[i++];
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) plain += t[i++];
    if (!digits()) return false;
  }
  if (i != t.size()) return false;
  value = std::strtod(plain.c_str(), nullptr);  // correctly rounded, as float(); overflow gives inf, as float()
  return true;
}


// The shapes a manifest before 2.6 names none of: seer_trt.contracts.config.CALIBRATION_SHAPES (tests/test_manifest.py
// checks the two agree); an export of 2.6 or later carries its own in "cost_calibration".
const std::array<int64_t, 3> LEGACY_CALIBRATION_SHAPES[] = {{1, 16, 4},   {1, 32, 16},  {1, 128, 32}, {1, 384, 64},
                                                            {1, 640, 128}, {4, 32, 8},   {4, 128, 32}, {8, 32, 8},
                                                            {16, 32, 16},  {16, 64, 32}};

// "lengths" (seer_trt.contracts.config.WindowRule), or before 2.6 the rule loop_blocks and the defaults imply
void read_lengths(const json& data, int64_t loop_blocks, const std::string& path, Manifest& m) {
  WindowRule& r = m.lengths;
  if (!data.contains("lengths") || data["lengths"].is_null()) {
    const GenerationConfig& g = m.generation;
    r = loop_blocks ? WindowRule{"split", 0, loop_blocks}
        : g.block_length == g.gen_length ? WindowRule{}
                                         : WindowRule{"cap", g.block_length, 0};
    return;
  }
  const json& l = data["lengths"];
  const std::string where = "manifest lengths";
  r.blocks = get<std::string>(l, "blocks", where);
  if (r.blocks != "whole" && r.blocks != "cap" && r.blocks != "split")
    throw manifest_error(path + ": window rule blocks '" + r.blocks + "' is not one of ['whole', 'cap', 'split']");
  for (auto [name, value] : {std::pair{"size", &r.size}, {"count", &r.count}}) {
    const bool wanted = (r.blocks == "cap" && name == std::string("size")) ||
                        (r.blocks == "split" && name == std::string("count"));
    const bool given = l.contains(name) && !l[name].is_null();
    if (given != wanted)
      throw manifest_error(path + ": window rule '" + r.blocks + "' " + (given ? "takes no " : "needs ") + name +
                           ", got " + l.dump());
    if (given && (*value = get<int64_t>(l, name, where)) < 1)
      throw manifest_error(path + ": window rule " + name + " must be a whole number >= 1, got " + l[name].dump());
  }
}

// "cost_calibration" (seer_trt.contracts.config.CostCalibration), or before 2.6 the legacy shapes
void read_cost_calibration(const json& data, const std::string& path, Manifest& m) {
  CostCalibration& c = m.cost_calibration;
  const bool named = data.contains("cost_calibration") && !data["cost_calibration"].is_null();
  const json& cc = named ? data["cost_calibration"] : json::object();
  if (!cc.is_object()) throw manifest_error(path + ": cost_calibration is not a JSON object; re-export with seer-export");
  c.repeats = get_or<int64_t>(cc, "repeats", 5, "manifest cost_calibration");
  if (c.repeats < 1 || c.repeats > CostCalibration::MAX_REPEATS)
    throw manifest_error(path + ": calibration repeats must be a whole number in [1, " +
                         std::to_string(CostCalibration::MAX_REPEATS) + "] (the timed steps per shape), got " +
                         std::to_string(c.repeats) + "; re-export with seer-export");
  if (!cc.contains("shapes") || cc["shapes"].is_null()) {
    c.shapes.assign(std::begin(LEGACY_CALIBRATION_SHAPES), std::end(LEGACY_CALIBRATION_SHAPES));
    return;
  }
  const json& shapes = cc["shapes"];
  bool ok = shapes.is_array() && !shapes.empty();
  for (size_t k = 0; ok && k < shapes.size(); ++k) {
    const json& s = shapes[k];
    std::array<int64_t, 3> shape{};
    ok = s.is_array() && s.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) ok = s[i].is_number_integer() && (shape[i] = s[i].get<int64_t>()) >= 1;
    c.shapes.push_back(shape);
  }
  if (!ok)
    throw manifest_error(path + ": calibration shapes must be one or more [rows, prompt, answer] of whole numbers >= 1, "
                         "got " + shapes.dump().substr(0, 80));
  const std::array<int64_t, 3> ceiling = {MAX_BUCKET_ROWS, MAX_BUCKET_PROMPT, MAX_BUCKET_ANSWER};
  auto shown = [](const std::array<int64_t, 3>& s) {  // as Python prints a list
    return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + "]";
  };
  std::string found = c.shapes.size() > CostCalibration::MAX_SHAPES ? std::to_string(c.shapes.size()) + " are given" : "";
  for (const auto& s : c.shapes)
    if (found.empty() && (s[0] > ceiling[0] || s[1] > ceiling[1] || s[2] > ceiling[2]))
      found = shown(s) + " is past the buckets' ceilings";
  if (!found.empty())
    throw manifest_error(path + ": calibration shapes: " + found + "; expected at most " +
                         std::to_string(CostCalibration::MAX_SHAPES) + " [rows, prompt, answer] of at most " +
                         shown(ceiling) + " (each is clipped to the export's buckets); re-export with seer-export");
}

// Python's repr() of a {name: id} dict, for the messages the two runtimes share
std::string python_dict(const std::vector<std::pair<std::string, int64_t>>& items) {
  std::string out;
  for (const auto& [name, value] : items) out += (out.empty() ? "{'" : ", '") + name + "': " + std::to_string(value);
  return out + "}";
}

// What the manifest says of its dims, ids and layers lies inside its own model (Python: ModelInfo, SpecialTokens,
// Manifest.check_bounds): dims >= 1, every special id and image marker id a row of the vocabulary, the probe layer
// one of the model's layers.
void check_bounds(const json& data, const std::string& path, const Manifest& m) {
  const json& model = data["model"];
  std::vector<std::pair<std::string, int64_t>> dims;
  for (const char* key : {"hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size"})
    if (const int64_t v = get<int64_t>(model, key, "manifest model"); v < 1) dims.emplace_back(key, v);
  if (!dims.empty())
    throw manifest_error(path + ": model " + python_dict(dims) + ": expected whole numbers >= 1 (the exported " +
                         "model's dims); re-export with seer-export");
  const SpecialTokens& t = m.special;
  const std::vector<std::pair<std::string, int64_t>> ids = {
      {"mask_id", t.mask_id}, {"endoftext_id", t.endoftext_id}, {"startoftext_id", t.startoftext_id},
      {"eot_id", t.eot_id}, {"start_header_id", t.start_header_id}, {"end_header_id", t.end_header_id}};
  std::vector<std::pair<std::string, int64_t>> negative, outside;
  for (const auto& id : ids) {
    if (id.second < 0) negative.push_back(id);
    else if (id.second >= m.vocab_size) outside.push_back(id);
  }
  if (!negative.empty())
    throw manifest_error(path + ": special_tokens " + python_dict(negative) + ": expected token ids, whole numbers " +
                         ">= 0 (the ids the export's tokenizer gives its special tokens); re-export with seer-export");
  const std::string vocabulary = "the vocabulary [0, " + std::to_string(m.vocab_size) + ") (model.vocab_size)";
  if (!outside.empty())
    throw manifest_error(path + ": special_tokens " + python_dict(outside) + " lie outside " + vocabulary +
                         "; the tokenizer and the graphs come from different models: re-export with seer-export");
  std::vector<int64_t> markers;
  for (const char* key : {"prefix_ids", "suffix_ids"})
    for (int64_t id : get_or<std::vector<int64_t>>(data["vision"], key, {}, "manifest vision"))
      if (id < 0 || id >= m.vocab_size) markers.push_back(id);
  if (!markers.empty())
    throw manifest_error(path + ": vision image marker ids " + json(markers).dump(-1) + " (prefix_ids, suffix_ids) " +
                         "lie outside " + vocabulary + "; re-export with seer-export");
  if (m.seer.probe_layer < 0)
    throw manifest_error(path + ": seer.probe_layer must be a whole number >= 0, got " +
                         std::to_string(m.seer.probe_layer) + "; re-calibrate with seer-calibrate --write");
  if (m.seer.probe_layer >= m.num_layers)
    throw manifest_error(path + ": seer.probe_layer " + std::to_string(m.seer.probe_layer) + " is not a layer of the " +
                         "model: expected 0 <= probe_layer < " + std::to_string(m.num_layers) + " (model.num_layers); " +
                         "re-calibrate with seer-calibrate --write, or re-export with seer-export");
}

}  // namespace

std::string python_repr(const std::string& text) {
  const char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t k = 0; k < text.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(text[k]);
    const unsigned char next = k + 1 < text.size() ? static_cast<unsigned char>(text[k + 1]) : 0;
    char hex[8];
    if (c == '\\' || c == quote) out += '\\', out += static_cast<char>(c);
    else if (c == '\t') out += "\\t";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) std::snprintf(hex, sizeof hex, "\\x%02x", c), out += hex;
    else if (c == 0xc2 && next >= 0x80 && next <= 0xa0)  // U+0080..U+00A0: not printable, \xNN in a repr
      std::snprintf(hex, sizeof hex, "\\x%02x", next), out += hex, ++k;
    else out += static_cast<char>(c);
  }
  return out + quote;
}

DecodingRule parse_decoding(const std::string& text) {
  const std::string forms = DECODING_FORMS, t = strip(text);
  const size_t colon = t.find(':');
  const std::string name = t.substr(0, colon), raw = colon == std::string::npos ? "" : t.substr(colon + 1);
  if (name == "fixed" && colon == std::string::npos) return {};
  if ((name != "threshold" && name != "factor") || colon == std::string::npos)
    throw config_error("decoding " + python_repr(text) + " is not one of " + forms);
  double value = 0;
  if (!python_float(raw, value))
    throw config_error("decoding " + python_repr(text) + ": " + python_repr(raw) + " is not a number; expected " +
                       forms);
  if (!std::isfinite(value) || value <= 0 || (name == "threshold" && value > 1))
    throw config_error("decoding " + python_repr(text) + ": the parameter is out of range; expected " + forms);
  return {name, value};
}

std::string canonical_decoding(const std::string& text) {
  const DecodingRule rule = parse_decoding(text);
  if (rule.fixed()) return rule.name;
  char value[64];
  std::snprintf(value, sizeof value, "%g", rule.value);  // Python's f"{value:g}": 6 significant digits
  return rule.name + ":" + value;
}

ConfidenceOutput confidence_output(const GraphEntry& window) {
  if (window.output("log_confidence")) return {"log_confidence", true};
  if (window.output("confidence")) return {"confidence", false};
  throw manifest_error("graph '" + window.name + "' returns neither log_confidence (schema 2.2) nor confidence " +
                       "(2.1); re-export with seer-export");
}

namespace {

// numpy's float32 log on x86-64 with AVX2 + FMA or AVX-512 (simd_log_FLOAT in numpy/_core/src/umath/
// loops_exponent_log.dispatch.c.src), one lane at a time: the mantissa m in [0.5, 1) and exponent k of x, m doubled
// below sqrt(1/2), then log(1 + (m - 1)) as a ratio of two degree-5 polynomials in fused multiply-adds, plus k ln 2.
// Equal to np.log on every float32 in [0, 1] and at inf, NaN and negatives (checked on numpy 2.4, AVX2).
float numpy_simd_logf(float in) {
  auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
  auto from = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
  if (std::isnan(in)) return std::numeric_limits<float>::quiet_NaN();
  if (in < 0.0f) return -std::numeric_limits<float>::quiet_NaN();
  if (in == 0.0f) return -std::numeric_limits<float>::infinity();
  if (std::isinf(in)) return in;
  const bool denormal = in < FLT_MIN;
  const float x_in = denormal ? in * from(0x71800000u) : in;  // * 2^100, exact
  float exponent = static_cast<float>(static_cast<int32_t>(bits(x_in) >> 23) - 0x7E) - (denormal ? 100.0f : 0.0f);
  float x = from((bits(x_in) & 0x7fffffu) | (126u << 23));
  if (x <= 0.707106781186547524400844362104849039F) x = x + x, exponent = exponent - 1.0f;
  x = x - 1.0f;
  float num = std::fma(2.589979117907922693523e-02f, x, 3.808837741388407920751e-01f);
  num = std::fma(num, x, 1.480000633576506585156e+00f);
  num = std::fma(num, x, 2.112677543073053063722e+00f);
  num = std::fma(num, x, 9.999999999999998702752e-01f);
  num = std::fma(num, x, 0.0f);
  float den = std::fma(5.875095403124574342950e-03f, x, 1.546476374983906719538e-01f);
  den = std::fma(den, x, 9.864942958519418960339e-01f);
  den = std::fma(den, x, 2.453006071784736363091e+00f);
  den = std::fma(den, x, 2.612677543073109236779e+00f);
  den = std::fma(den, x, 1.0f);
  return std::fma(exponent, 0.693147180559945309417232121458176568F, num / den);
}

bool numpy_uses_simd_log() {  // numpy's dispatch: its AVX2 + FMA3 or AVX-512F kernel where the CPU has one
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) || __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

}  // namespace

void log_in_place(float* values, size_t count) {
  static const bool simd = numpy_uses_simd_log();
  for (size_t k = 0; k < count; ++k) values[k] = simd ? numpy_simd_logf(values[k]) : std::log(values[k]);
}

int64_t VisionInfo::max_tiles() const {
  int64_t grid = 0;
  for (const auto& [w, h] : grid_pinpoints) grid = std::max(grid, (w / image_size) * (h / image_size));
  return anyres() && !grid_pinpoints.empty() ? 1 + grid : 1;
}

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
  if (schedule != "even" && schedule != "dream")
    throw config_error("schedule must be one of ['even', 'dream'], got '" + schedule + "'");
  if (schedule == "dream" && block_length != gen_length)
    throw config_error("the dream schedule runs one block over the whole window (diffusion_generate); block_length " +
                       std::to_string(block_length) + " differs from gen_length " + std::to_string(gen_length));
  if (steps % num_blocks())
    throw config_error("steps " + std::to_string(steps) + " is not a multiple of the number of blocks " +
                       std::to_string(num_blocks()) + " (gen_length " + std::to_string(gen_length) +
                       " / block_length " + std::to_string(block_length) + "); choose steps divisible by it");
}

std::pair<int64_t, int64_t> WindowRule::shape(int64_t n, const GenerationConfig& base,
                                              std::optional<int64_t> block) const {
  if (!block && blocks == "split" && n % count)
    throw config_error("gen_length " + std::to_string(n) + ": this model's loop splits the window into " +
                       std::to_string(count) + " blocks; ask for a multiple of " + std::to_string(count) +
                       ", or pass block_length");
  if (!block) block = blocks == "split" ? n / count : blocks == "cap" ? std::min(size, n) : n;
  return {*block, std::max<int64_t>(1, n * base.steps / base.gen_length)};
}

bool GenerationConfig::operator<(const GenerationConfig& o) const {
  return std::tie(gen_length, steps, block_length, temperature, remasking, decoding, schedule) <
         std::tie(o.gen_length, o.steps, o.block_length, o.temperature, o.remasking, o.decoding, o.schedule);
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
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    const std::string found =
        std::filesystem::is_directory(folder, ec) ? "it holds no manifest.json" : "it does not exist";
    throw manifest_error(folder + " is not an export folder (" + found + "); create one with `seer-export --out " +
                         folder + "`");
  }
  json data;
  try {
    data = json::parse(read_bounded(export_path(folder, "manifest.json", "manifest"), folder, "the manifest",
                                    MAX_MANIFEST_BYTES));
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
  int64_t loop_blocks = 0;  // read only where the manifest names no "lengths" (before 2.6)
  if (model.contains("loop_blocks") && !model["loop_blocks"].is_null()) {  // absent before 2.3
    loop_blocks = get<int64_t>(model, "loop_blocks", "manifest model");
    if (loop_blocks < 1)
      throw manifest_error(path + ": model.loop_blocks is " + std::to_string(loop_blocks) + "; expected >= 1 or null");
  }
  m.vocab_size = get<int64_t>(model, "vocab_size", "manifest model");
  m.num_layers = get<int64_t>(model, "num_layers", "manifest model");
  m.logit_shift = get_or<int64_t>(model, "logit_shift", 0, "manifest model");  // absent before 2.4
  if (m.logit_shift != 0 && m.logit_shift != 1)
    throw manifest_error(path + ": model.logit_shift is " + std::to_string(m.logit_shift) + "; expected 0 or 1");

  const json& vision = field(data, "vision", path);
  m.vision.image_size = get<int64_t>(vision, "image_size", "manifest vision");
  m.vision.patch_size = get<int64_t>(vision, "patch_size", "manifest vision");
  m.vision.tokens_per_tile = get<int64_t>(vision, "tokens_per_tile", "manifest vision");
  m.vision.image_aspect_ratio = get<std::string>(vision, "image_aspect_ratio", "manifest vision");
  m.vision.newline = get<std::string>(vision, "newline", "manifest vision");
  m.vision.encoder = get_or<std::string>(vision, "encoder", "siglip", "manifest vision");  // absent before 2.3
  if (m.vision.encoder != "siglip" && m.vision.encoder != "magvitv2" && m.vision.encoder != "none")
    throw manifest_error(path + ": vision.encoder '" + m.vision.encoder +
                         "' is not 'siglip', 'magvitv2' or 'none'; rebuild the C++ library from the seer-trt that exported it");
  if (vision.contains("anyres_max_tiles") && !vision["anyres_max_tiles"].is_null())
    m.vision.anyres_max_tiles = get<int64_t>(vision, "anyres_max_tiles", "manifest vision");
  using Pinpoints = std::vector<std::vector<int64_t>>;
  for (const auto& p : get_or<Pinpoints>(vision, "grid_pinpoints", {}, "manifest vision")) {
    if (p.size() != 2 || p[0] < 1 || p[1] < 1)
      throw manifest_error(path + ": vision.grid_pinpoints holds " + json(p).dump() +
                           "; expected [width, height] px pairs; re-export with seer-export");
    m.vision.grid_pinpoints.emplace_back(p[0], p[1]);
  }
  if (m.vision.image_size < 1)
    throw manifest_error(path + ": vision.image_size is " + std::to_string(m.vision.image_size) +
                         "; expected a positive tile size in px; re-export with seer-export");

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
  s.tail = get_or<double>(seer, "tail", s.tail, wseer);  // absent before 2.5
  s.tail_token = get_or<std::string>(seer, "tail_token", s.tail_token, wseer);
  if (!(s.tail >= 0 && s.tail <= 1) || (s.tail_token != "eot" && s.tail_token != "endoftext"))
    throw manifest_error(path + ": seer.tail must be a share in [0, 1] and seer.tail_token one of eot, endoftext; "
                         "re-calibrate with seer-calibrate");
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
  try {  // a 2.1 export names no decoding: the fixed loop, as Python reads it
    if (gen.contains("decoding") && !gen["decoding"].is_string())
      throw config_error("decoding is " + (gen["decoding"].is_null() ? "None" : gen["decoding"].dump()) +
                         "; expected " + DECODING_FORMS);
    m.generation.decoding = canonical_decoding(get_or<std::string>(gen, "decoding", "fixed", wg));
    m.generation.schedule = get_or<std::string>(gen, "schedule", "even", wg);  // absent before 2.4
    m.generation.validate();
  } catch (const Error& err) {
    throw manifest_error(path + ": " + err.what());
  }
  read_lengths(data, loop_blocks, path, m);
  read_cost_calibration(data, path, m);
  check_bounds(data, path, m);
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
  export_path(folder, m.tokenizer, "tokenizer");  // every path it names lies inside the folder
  for (const auto& [name, g] : m.graphs) export_path(folder, g.file, "graphs." + name + ".file");
  if (m.weights) {
    export_path(folder, m.weights->file, "weights.file");
    export_path(folder, m.weights->index, "weights.index");
  }
  return m;
}

}  // namespace seer
