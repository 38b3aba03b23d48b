// seer_run: seer-run's JSONL interface over the C++ runtime (docs/DESIGN.md "C++ runtime").
//
// In:  --engines DIR (a seer-export folder), --input requests.jsonl ('-': stdin), one JSON object per line:
//      prompt_ids (chat-formatted, -200 where the image goes; seer-prompt-ids prints them), optional image_tiles
//      (a .npy of float32 [tiles, 3, S, S]; seer-prompt-ids --tiles writes it), image_grid and image_size (anyres),
//      gen_length, steps, block_length, decoding, window, seer, early_stop, cache, refresh_interval, temperature,
//      top_p, seed, remasking and stop as seer-run / seer-serve take them; or {"error": "..."}, a line
//      seer-prompt-ids could not convert, which fails as that error.
// Out: one JSON result per line in --output (stdout by default), seer-run's fields (text, token_ids, window, kept,
//      steps, gen_length, seconds, error, refreshes); seconds also holds "graphs", the time inside ONNX Runtime. Exit status:
//      0 every request answered, 1 some failed, 2 a bad invocation (one line on stderr).
//
// Every input is bounded by the export before anything that grows with it is held: a line by
// LINE_BYTES_PER_ID * the largest prompt bucket + LINE_BYTES_OTHER bytes (a request's prompt ids fit that bucket),
// image tiles by the export's tile shape (npy.hpp). A line past its bound fails alone, as a bad request does.
// --output is written whole or not at all: staged in a file of its own folder (.NAME.partial-PID-XXXXXX), renamed
// over it at the end and removed on any failure; a folder that is not there or an --output that is one is refused
// before any work.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "npy.hpp"
#include "seer/seer.hpp"

namespace {

using nlohmann::json;
const char* const PROG = "seer_run";

constexpr int64_t LINE_BYTES_PER_ID = 24;   // "-9223372036854775808, ": the longest id and its separator is 22
constexpr int64_t LINE_BYTES_OTHER = 65536;  // the other fields: an image_tiles path (PATH_MAX 4096), the settings
static_assert(LINE_BYTES_PER_ID == 24 && LINE_BYTES_OTHER == 65536, "USAGE states the line bound: update it too");

// a literal (tools/cli_docs.py copies it into docs/cli.md): keep its "24 * P + 65536" equal to the two bounds above
const char* const USAGE =
    "usage: seer_run --engines DIR --input FILE.jsonl [--output FILE.jsonl] [--no-seer] [--early-stop]\n"
    "                [--gen-length N] [--steps N] [--decoding RULE] [--policy NAME] [--provider cpu|cuda|tensorrt]\n"
    "                [--device-id N] [--threads N] [--cache none|reuse|forecast] [--refresh-interval R]\n"
    "                [--forecast-order 1|2] [--temperature T] [--top-p P] [--seed N] [--ort-library PATH]\n"
    "Answer JSONL requests (prompt_ids, image_tiles) with the Seer pipeline over ONNX Runtime; seer-run's fields.\n"
    "  --input        one request per line, of at most 24 * P + 65536 bytes (P: the export's largest prompt bucket;\n"
    "                 a longer line fails alone); '-' reads stdin\n"
    "  --output       written whole or not at all (staged beside it as .NAME.partial-PID-XXXXXX); its folder must\n"
    "                 exist (default: stdout)\n"
    "  --decoding     how many positions a step commits: fixed (the schedule's count), threshold:TAU (probability\n"
    "                 >= TAU, at least one) or factor:F (LLaDA-V's Fast-dLLM rule) (default: the export's)\n"
    "  --policy       cost_model (default), hybrid, naive_pad, static, packed, per_request\n"
    "  --cache        prompt K/V cache: none (the exact loop), reuse (default, R = 8), forecast\n"
    "  --temperature  0: greedy; (0, 2]: sampled, as seer-run samples (the export's by default)\n"
    "  --top-p        nucleus sampling mass in (0, 1] (default 1); --seed: the requests' sampling seed (default 0)\n"
    "  --ort-library  libonnxruntime.so to load (default: $SEER_ORT_LIBRARY, else the build's SDK)\n";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

// OpenAI's stop: a string or a list of them
std::vector<std::string> stop_sequences(const json& v) {
  const json list = v.is_string() ? json::array({v}) : v;
  if (!list.is_array())
    throw seer::Error(seer::Error::Kind::Input, "stop is " + python_value(v) + "; expected a string or a list of "
                                                    "strings");
  std::vector<std::string> out;
  for (const json& q : list) {
    if (!q.is_string())
      throw seer::Error(seer::Error::Kind::Input, "stop holds " + python_value(q) + "; expected strings");
    out.push_back(q.get<std::string>());
  }
  return out;
}

seer::Request parse_request(const json& data, const seer_run::TileShape& tile_shape) {
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
      r.pixel_values = seer_run::read_tiles(v.get<std::string>(), tile_shape, r.tiles);
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
      if (v.is_null()) continue;
      if (!v.is_number() || v.is_boolean())
        throw seer::Error(seer::Error::Kind::Input, "temperature is " + python_value(v) + "; expected a number in "
                                                        "[0, 2] (0: greedy; OpenAI's range)");
      r.temperature = v.get<double>();
    } else if (key == "top_p") {
      if (!v.is_number() || v.is_boolean())
        throw seer::Error(seer::Error::Kind::Input, "top_p is " + python_value(v) + "; expected a number in (0, 1] "
                                                        "(1: the whole vocabulary)");
      r.top_p = v.get<double>();
    } else if (key == "remasking") {
      if (!v.is_null() && !v.is_string())
        throw seer::Error(seer::Error::Kind::Input, "remasking is " + python_value(v) + "; expected a string");
      if (!v.is_null()) r.remasking = v.get<std::string>();
    } else if (key == "stop") {
      if (!v.is_null()) r.stop = stop_sequences(v);
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
      const int64_t seed = whole(v, "seed");
      if (seed < 0) throw seer::Error(seer::Error::Kind::Input, "seed is " + v.dump() + "; expected a whole number "
                                                                "in [0, 2**63)");
      r.seed = static_cast<uint64_t>(seed);
    } else {
      throw seer::Error(seer::Error::Kind::Input,
                        "unknown request key '" + key + "'; expected a subset of block_length, cache, decoding, "
                        "early_stop, gen_length, image_grid, image_size, image_tiles, prompt_ids, refresh_interval, "
                        "remasking, seed, seer, steps, stop, temperature, top_p, window (system, history and image: "
                        "encode them with seer-prompt-ids)");
    }
  }
  return r;
}

// seer-run's key order (nlohmann's ordered_json keeps it)
nlohmann::ordered_json result_json(const seer::Result& r) {
  using ordered = nlohmann::ordered_json;
  if (!r.ok())
    return ordered{{"text", ""}, {"token_ids", ordered::array()}, {"window", ordered::array()}, {"kept", 0}, {"steps", 0},
            {"gen_length", 0}, {"seconds", ordered::object()}, {"error", r.error}, {"refreshes", 0},
            {"error_kind", "input"}};  // a request's failure is its input's: anything else stops the run
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
          {"refreshes", r.refreshes},
          {"error_kind", nullptr}};
}

struct Invocation {
  std::string engines, input, output;  // --input "-": stdin; --output "": stdout
  seer::Options options;
  json overrides = json::object();  // request fields the flags set where a line sets none
};

Invocation parse_args(int argc, char** argv) {
  Invocation inv;
  seer::Options& options = inv.options;
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
    auto real = [&]() -> double {
      const std::string v = value();
      size_t used = 0;
      try {
        const double n = std::stod(v, &used);
        if (used == v.size()) return n;
      } catch (const std::exception&) {
      }
      throw Usage(a + " is '" + v + "'; expected a number");
    };
    if (a == "-h" || a == "--help") {
      std::cout << USAGE;
      std::exit(0);
    } else if (a == "--engines") inv.engines = value();
    else if (a == "--input") inv.input = value();
    else if (a == "--output") inv.output = value();
    else if (a == "--policy") options.policy = value();
    else if (a == "--provider") options.provider = value();
    else if (a == "--device-id") options.device_id = static_cast<int>(integer());
    else if (a == "--threads") options.threads = static_cast<int>(integer());
    else if (a == "--ort-library") options.ort_library = value();
    else if (a == "--cache") options.cache = value();
    else if (a == "--refresh-interval") options.refresh_interval = integer();
    else if (a == "--forecast-order") options.forecast_order = integer();
    else if (a == "--no-seer") inv.overrides["seer"] = false;
    else if (a == "--early-stop") inv.overrides["early_stop"] = true;
    else if (a == "--gen-length") inv.overrides["gen_length"] = integer();
    else if (a == "--steps") inv.overrides["steps"] = integer();
    else if (a == "--decoding") inv.overrides["decoding"] = value();
    else if (a == "--temperature") inv.overrides["temperature"] = real();
    else if (a == "--top-p") inv.overrides["top_p"] = real();
    else if (a == "--seed") inv.overrides["seed"] = integer();
    else throw Usage("unknown argument " + a);
  }
  if (inv.engines.empty() || inv.input.empty()) throw Usage("--engines and --input are required");
  return inv;
}

// The next line of `in` (its '\n' dropped) into `line` when it holds at most `limit` bytes; a longer one is read
// through and dropped, never held. `bytes`: the line's length either way. False at the end of the input.
bool next_line(std::istream& in, size_t limit, std::string& line, size_t& bytes) {
  std::streambuf& buf = *in.rdbuf();
  line.clear();
  bytes = 0;
  int c;
  while ((c = buf.sbumpc()) != std::char_traits<char>::eof() && c != '\n')
    if (++bytes <= limit) line.push_back(static_cast<char>(c));
  return c == '\n' || bytes > 0;
}

// Per line of --input: a Request in `requests` and "" in `errors`, or why the line is not one (it fails alone).
void read_requests(std::istream& in, const seer::Pipeline& pipeline, const json& overrides,
                   std::vector<seer::Request>& requests, std::vector<std::string>& errors) {
  const size_t limit = LINE_BYTES_PER_ID * pipeline.max_prompt_ids() + LINE_BYTES_OTHER;
  const seer_run::TileShape tile_shape{pipeline.image_size(), pipeline.max_tiles()};
  std::string line;
  size_t bytes = 0;
  for (int number = 1; next_line(in, limit, line, bytes); ++number) {
    const std::string where = "line " + std::to_string(number) + ": ";
    if (bytes > limit) {
      errors.push_back(where + std::to_string(bytes) + " bytes, more than the " + std::to_string(limit) +
                       " a request line may hold (" + std::to_string(LINE_BYTES_PER_ID) + " per id of the largest "
                       "prompt bucket, " + std::to_string(pipeline.max_prompt_ids()) + ", + " +
                       std::to_string(LINE_BYTES_OTHER) + "); a request holds at most " +
                       std::to_string(pipeline.max_prompt_ids()) + " prompt_ids (seer-prompt-ids writes them)");
      continue;
    }
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 BOM
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json data = json::parse(line);
      if (data.is_object() && data.contains("error") && data["error"].is_string()) {
        errors.push_back(data["error"].get<std::string>());  // seer-prompt-ids could not convert this line
        continue;
      }
      if (data.is_object())
        for (const auto& [k, v] : overrides.items())
          if (!data.contains(k)) data[k] = v;
      requests.push_back(parse_request(data, tile_shape));
      errors.emplace_back();
    } catch (const json::parse_error& err) {
      errors.push_back(where + "not JSON (" + err.what() + ")");
    } catch (const std::exception& err) {
      errors.push_back(where + err.what());
    }
  }
}

// The staging file of --output while it may exist, for a signal to remove ("" when none).
char staging_path[4096] = "";

extern "C" void remove_staging(int sig) {
  if (staging_path[0]) ::unlink(staging_path);  // async-signal-safe, as are signal and raise
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct OutputPath {
  std::string folder, name;  // --output's folder ("." when it names none) and file name
};

// Refuses, before any work, an --output that is a folder or another non-file, or whose folder is not there (none
// is made) or takes no new file.
OutputPath check_output(const std::string& output) {
  auto refused = [&](const std::string& why) {
    return seer::Error(seer::Error::Kind::Input, "--output " + output + " " + why);
  };
  const size_t slash = output.find_last_of('/');
  OutputPath at{slash == std::string::npos ? "." : slash == 0 ? "/" : output.substr(0, slash),
                slash == std::string::npos ? output : output.substr(slash + 1)};
  struct stat info {};
  const bool exists = ::stat(output.c_str(), &info) == 0;
  if ((exists && S_ISDIR(info.st_mode)) || at.name.empty() || at.name == "." || at.name == "..")
    throw refused("names a folder; name the JSONL file to write, e.g. " + output + (output.back() == '/' ? "" : "/") +
                  "results.jsonl");
  if (exists && !S_ISREG(info.st_mode))
    throw refused("is not a regular file (a device, FIFO or socket); name a file, or leave --output out for stdout");
  if (::stat(at.folder.c_str(), &info) != 0)
    throw refused("is in " + at.folder + ", which " + (errno == ENOENT ? std::string("does not exist") : std::string("cannot be looked up (") + std::strerror(errno) + ")") +
                  "; create the folder first (seer_run makes none)");
  if (!S_ISDIR(info.st_mode)) throw refused("is in " + at.folder + ", which is not a folder; name a file in one");
  if (::access(at.folder.c_str(), W_OK | X_OK) != 0)
    throw refused("cannot be written: folder " + at.folder + " takes no new file (" + std::strerror(errno) + ")");
  return at;
}

// `text` as --output, whole or not at all: written to a file of its own in the same folder, renamed over --output
// at the end, and removed if any step fails.
void write_output(const std::string& output, const OutputPath& at, const std::string& text) {
  const std::string staging = at.folder + "/." + at.name + ".partial-" + std::to_string(::getpid()) + "-XXXXXX";
  if (staging.size() >= sizeof staging_path)
    throw seer::Error(seer::Error::Kind::Input, "--output " + output + " is a longer path than seer_run can stage");
  std::memcpy(staging_path, staging.c_str(), staging.size() + 1);
  const int fd = ::mkstemp(staging_path);  // fills in the XXXXXX where the signal handler reads it
  int err = fd < 0 ? errno : 0;            // errno of the first step that failed
  auto check = [&](bool done) {
    if (!done && !err) err = errno;
    return done;
  };
  const mode_t mask = ::umask(0);  // mkstemp makes 0600; --output gets what a new file gets
  ::umask(mask);
  if (fd >= 0) {
    check(::fchmod(fd, 0666 & ~mask) == 0);
    for (size_t done = 0; !err && done < text.size();) {
      const ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
      if (wrote > 0) done += wrote;
      else if (wrote == 0 || errno != EINTR) err = wrote == 0 ? EIO : errno;
    }
    if (!err) check(::fsync(fd) == 0);
    check(::close(fd) == 0);
    if (!err) check(::rename(staging_path, output.c_str()) == 0);
    if (err) ::unlink(staging_path);
  }
  staging_path[0] = '\0';
  if (err)
    throw seer::Error(seer::Error::Kind::Input, "cannot write --output " + output + " (" + std::strerror(err) +
                                                    "); nothing was written");
}

int run(int argc, char** argv) {
  const Invocation inv = parse_args(argc, argv);
  const OutputPath at = inv.output.empty() ? OutputPath{} : check_output(inv.output);
  std::ifstream file;
  if (inv.input != "-") {
    file.open(inv.input, std::ios::binary);
    if (!file) throw seer::Error(seer::Error::Kind::Input, "cannot read --input " + inv.input + "; pass a JSONL file");
  }
  auto pipeline = seer::Pipeline::open(inv.engines, inv.options);
  std::vector<seer::Request> requests;
  std::vector<std::string> errors;  // per line: "" or why it is not a request
  read_requests(inv.input == "-" ? std::cin : file, *pipeline, inv.overrides, requests, errors);
  if (errors.empty()) throw seer::Error(seer::Error::Kind::Input, "--input " + inv.input + " holds no requests");
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
  if (inv.output.empty()) std::cout << out;
  else write_output(inv.output, at, out);
  std::cerr << PROG << ": " << errors.size() - failed << " answered, " << failed << " failed\n";
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);  // stdin is read a byte at a time (next_line): through iostream's own buffer
  for (int sig : {SIGINT, SIGTERM, SIGHUP})  // a signal ignored (nohup) stays ignored
    if (std::signal(sig, remove_staging) == SIG_IGN) std::signal(sig, SIG_IGN);
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
