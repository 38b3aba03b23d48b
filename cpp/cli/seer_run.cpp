// seer_run: seer-run's JSONL interface over the C++ runtime (docs/DESIGN.md "C++ runtime").
//
// In:  --engines DIR (a seer-export folder), --input requests.jsonl ('-': stdin), one JSON object per line:
//      prompt_ids (chat-formatted, -200 where the image goes; seer-prompt-ids prints them), optional image_tiles
//      (a .npy of float32 [tiles, 3, S, S]; seer-prompt-ids --tiles writes it), image_grid and image_size (anyres),
//      gen_length, steps, block_length, decoding, window, seer, early_stop, cache, refresh_interval, and
//      temperature 0 / remasking low_confidence / seed as seer-run takes them.
// Out: one JSON result per line in --output (stdout by default), seer-run's fields (text, token_ids, window, kept,
//      steps, gen_length, seconds, error, refreshes); seconds also holds "graphs", the time inside ONNX Runtime. Exit status:
//      0 every request answered, 1 some failed, 2 a bad invocation (one line on stderr).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "seer/seer.hpp"

namespace {

using nlohmann::json;
const char* const PROG = "seer_run";

const char* const USAGE =
    "usage: seer_run --engines DIR --input FILE.jsonl [--output FILE.jsonl] [--no-seer] [--early-stop]\n"
    "                [--gen-length N] [--steps N] [--decoding RULE] [--policy NAME] [--provider cpu|cuda|tensorrt]\n"
    "                [--device-id N] [--threads N] [--cache none|reuse|forecast] [--refresh-interval R]\n"
    "                [--forecast-order 1|2] [--ort-library PATH]\n"
    "Answer JSONL requests (prompt_ids, image_tiles) with the Seer pipeline over ONNX Runtime; seer-run's fields.\n"
    "  --decoding     how many positions a step commits: fixed (the schedule's count), threshold:TAU (probability\n"
    "                 >= TAU, at least one) or factor:F (LLaDA-V's Fast-dLLM rule) (default: the export's)\n"
    "  --policy       cost_model (default), hybrid, naive_pad, static, packed, per_request\n"
    "  --cache        prompt K/V cache: none (the exact loop), reuse (default, R = 8), forecast\n"
    "  --ort-library  libonnxruntime.so to load (default: $SEER_ORT_LIBRARY, else the build's SDK)\n";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// float32 [tiles, 3, S, S] (or [3, S, S]) from a .npy file (format versions 1-3, little-endian, C order).
std::vector<float> read_npy(const std::string& path, int64_t& tiles) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " does not exist; pass a .npy file");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " is not a .npy file (np.save writes one)");
  uint32_t len = 0;
  unsigned char b[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(b), magic[6] == 1 ? 2 : 4);
  len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  std::string header(len, '\0');
  in.read(header.data(), len);
  auto shape_at = header.find("'shape':");
  const bool f32 = header.find("'descr': '<f4'") != std::string::npos;
  const bool c_order = header.find("'fortran_order': False") != std::string::npos;
  std::vector<int64_t> shape;
  if (shape_at != std::string::npos) {
    std::istringstream dims(header.substr(header.find('(', shape_at) + 1));
    for (int64_t v; dims >> v;) {
      shape.push_back(v);
      char sep;
      if (!(dims >> sep) || sep == ')') break;
    }
  }
  if (!in || !f32 || !c_order || (shape.size() != 3 && shape.size() != 4))
    throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " holds " + header +
                                                    "; expected float32 [tiles, 3, S, S] in C order");
  tiles = shape.size() == 4 ? shape[0] : 1;
  size_t count = 1;
  for (int64_t v : shape) count *= static_cast<size_t>(v);
  std::vector<float> data(count);
  if (!in.read(reinterpret_cast<char*>(data.data()), count * sizeof(float)))
    throw seer::Error(seer::Error::Kind::Input, "image_tiles " + path + " is shorter than its shape says");
  return data;
}

int64_t whole(const json& v, const char* name) {
  if (!v.is_number_integer())
    throw seer::Error(seer::Error::Kind::Input, std::string(name) + " is " + v.dump() + "; expected a whole number");
  return v.get<int64_t>();
}

bool flag(const json& v, const char* name) {
  if (!v.is_boolean())
    throw seer::Error(seer::Error::Kind::Input, std::string(name) + " is " + v.dump() + "; expected true or false");
  return v.get<bool>();
}

// A JSON value as Python's repr() shows what json.loads made of it (True, not true); strings never come here.
std::string python_value(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  return v.dump();
}

seer::Request parse_request(const json& data) {
  if (!data.is_object())
    throw seer::Error(seer::Error::Kind::Input, "a request must be a JSON object with 'prompt_ids', got " +
                                                    data.dump().substr(0, 80));
  if (data.contains("prompt") && !data.contains("prompt_ids"))
    throw seer::Error(seer::Error::Kind::Input,
                      "the C++ runtime takes prompt_ids, not prompt text (the chat template is Jinja and the real "
                      "tokenizer BPE); print them with seer-prompt-ids --engines DIR --prompt TEXT");
  if (!data.contains("prompt_ids") || !data["prompt_ids"].is_array())
    throw seer::Error(seer::Error::Kind::Input, "a request needs 'prompt_ids', a list of token ids");
  seer::Request r;
  for (const auto& [key, v] : data.items()) {
    if (key == "prompt_ids") {
      for (const json& id : v) r.prompt_ids.push_back(whole(id, "prompt_ids[]"));
    } else if (key == "image_tiles") {
      if (!v.is_string()) throw seer::Error(seer::Error::Kind::Input, "image_tiles must be a .npy path");
      r.pixel_values = read_npy(v.get<std::string>(), r.tiles);
    } else if (key == "image_grid" || key == "image_size") {
      if (!v.is_array() || v.size() != 2)
        throw seer::Error(seer::Error::Kind::Input, key + " must be [a, b], got " + v.dump());
      (key == "image_grid" ? r.grid_cols : r.image_width) = whole(v[0], key.c_str());
      (key == "image_grid" ? r.grid_rows : r.image_height) = whole(v[1], key.c_str());
    } else if (key == "gen_length" || key == "steps" || key == "block_length" || key == "window") {
      if (v.is_null()) continue;
      const int64_t value = whole(v, key.c_str());
      (key == "gen_length" ? r.gen_length : key == "steps" ? r.steps : key == "block_length" ? r.block_length
                                                                                              : r.window) = value;
    } else if (key == "seer") {
      r.seer = flag(v, "seer");
    } else if (key == "early_stop") {
      r.early_stop = flag(v, "early_stop");
    } else if (key == "temperature") {
      if (!v.is_null() && (!v.is_number() || v.get<double>() != 0.0))
        throw seer::Error(seer::Error::Kind::Input, "temperature " + v.dump() + ": the C++ runtime decodes greedily "
                                                    "(temperature 0); sample with seer-run");
    } else if (key == "remasking") {
      if (!v.is_null() && v != "low_confidence")
        throw seer::Error(seer::Error::Kind::Input, "remasking " + v.dump() + ": the C++ runtime remasks by "
                                                    "low_confidence; use seer-run for random remasking");
    } else if (key == "decoding") {
      if (v.is_null()) continue;
      if (!v.is_string())  // Python's message (seer_trt.contracts.config.parse_decoding) for a value of another type
        throw seer::Error(seer::Error::Kind::Input, "decoding is " + python_value(v) + "; expected " +
                                                        seer::DECODING_FORMS);
      r.decoding = v.get<std::string>();
      seer::canonical_decoding(*r.decoding);  // a bad rule fails its line, as seer-run's request check does
    } else if (key == "cache") {
      if (v.is_null()) continue;
      if (!v.is_string())
        throw seer::Error(seer::Error::Kind::Input, "cache is " + v.dump() + "; expected one of none, reuse, forecast");
      r.cache = v.get<std::string>();
    } else if (key == "refresh_interval") {
      if (!v.is_null()) r.refresh_interval = whole(v, "refresh_interval");
    } else if (key == "seed") {
      whole(v, "seed");  // greedy decoding draws nothing
    } else {
      throw seer::Error(seer::Error::Kind::Input,
                        "unknown request key '" + key + "'; expected a subset of block_length, cache, decoding, "
                        "early_stop, gen_length, image_grid, image_size, image_tiles, prompt_ids, refresh_interval, "
                        "remasking, seed, seer, steps, temperature, window (system and image: encode them with "
                        "seer-prompt-ids)");
    }
  }
  return r;
}

// seer-run's key order (nlohmann's ordered_json keeps it)
nlohmann::ordered_json result_json(const seer::Result& r) {
  using ordered = nlohmann::ordered_json;
  if (!r.ok())
    return ordered{{"text", ""}, {"token_ids", ordered::array()}, {"window", ordered::array()}, {"kept", 0}, {"steps", 0},
            {"gen_length", 0}, {"seconds", ordered::object()}, {"error", r.error}, {"refreshes", 0}};
  const seer::Timings& t = r.seconds;
  return ordered{{"text", r.text ? ordered(*r.text) : ordered(nullptr)},
          {"token_ids", r.token_ids},
          {"window", r.window},
          {"kept", r.kept},
          {"steps", r.steps},
          {"gen_length", r.gen_length},
          {"seconds", ordered{{"preprocess", t.preprocess}, {"step_zero", t.step_zero}, {"boundary", t.boundary},
                       {"dispatch", t.dispatch}, {"packing", t.packing}, {"denoise", t.denoise},
                       {"detokenize", t.detokenize}, {"graphs", t.graphs}}},
          {"error", nullptr},
          {"refreshes", r.refreshes}};
}

int run(int argc, char** argv) {
  std::string engines, input, output, policy;
  seer::Options options;
  json overrides = json::object();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Usage(a + " needs a value");
      return argv[++i];
    };
    auto integer = [&]() -> int64_t {
      const std::string v = value();
      size_t used = 0;
      try {
        const long long n = std::stoll(v, &used);
        if (used == v.size()) return n;
      } catch (const std::exception&) {
      }
      throw Usage(a + " is '" + v + "'; expected a whole number");
    };
    if (a == "-h" || a == "--help") {
      std::cout << USAGE;
      std::exit(0);
    } else if (a == "--engines") engines = value();
    else if (a == "--input") input = value();
    else if (a == "--output") output = value();
    else if (a == "--policy") options.policy = value();
    else if (a == "--provider") options.provider = value();
    else if (a == "--device-id") options.device_id = static_cast<int>(integer());
    else if (a == "--threads") options.threads = static_cast<int>(integer());
    else if (a == "--ort-library") options.ort_library = value();
    else if (a == "--cache") options.cache = value();
    else if (a == "--refresh-interval") options.refresh_interval = integer();
    else if (a == "--forecast-order") options.forecast_order = integer();
    else if (a == "--no-seer") overrides["seer"] = false;
    else if (a == "--early-stop") overrides["early_stop"] = true;
    else if (a == "--gen-length") overrides["gen_length"] = integer();
    else if (a == "--steps") overrides["steps"] = integer();
    else if (a == "--decoding") overrides["decoding"] = value();
    else throw Usage("unknown argument " + a);
  }
  if (engines.empty() || input.empty()) throw Usage("--engines and --input are required");
  std::string text;
  if (input == "-") {
    std::ostringstream all;
    all << std::cin.rdbuf();
    text = all.str();
  } else {
    std::ifstream in(input, std::ios::binary);
    if (!in) throw seer::Error(seer::Error::Kind::Input, "cannot read --input " + input + "; pass a JSONL file");
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 BOM
  auto pipeline = seer::Pipeline::open(engines, options);
  std::vector<seer::Request> requests;
  std::vector<std::string> errors;  // per line: "" or why it is not a request
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json data = json::parse(line);
      if (data.is_object())
        for (const auto& [k, v] : overrides.items())
          if (!data.contains(k)) data[k] = v;
      requests.push_back(parse_request(data));
      errors.emplace_back();
    } catch (const json::parse_error& err) {
      errors.push_back("line " + std::to_string(number) + ": not JSON (" + err.what() + ")");
    } catch (const std::exception& err) {
      errors.push_back("line " + std::to_string(number) + ": " + err.what());
    }
  }
  if (errors.empty()) throw seer::Error(seer::Error::Kind::Input, "--input " + input + " holds no requests");
  std::vector<seer::Result> answered = pipeline->generate(requests);
  std::string out;
  int failed = 0;
  size_t next = 0;
  for (const std::string& err : errors) {
    seer::Result r;
    if (err.empty()) r = answered[next++];
    else r.error = err;
    failed += !r.ok();
    out += result_json(r).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }
  if (output.empty()) {
    std::cout << out;
  } else {
    const std::string partial = output + ".partial";
    std::ofstream(partial, std::ios::binary) << out;
    if (std::rename(partial.c_str(), output.c_str()) != 0)
      throw seer::Error(seer::Error::Kind::Input, "cannot write --output " + output);
  }
  std::cerr << PROG << ": " << errors.size() - failed << " answered, " << failed << " failed\n";
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Usage& err) {
    std::cerr << PROG << ": " << err.what() << "\n" << USAGE;
    return 2;
  } catch (const std::exception& err) {
    std::cerr << PROG << ": " << err.what() << "\n";
    return 2;
  }
}
