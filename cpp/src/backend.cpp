#include "backend.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#ifndef SEER_DEFAULT_ORT_LIBRARY
#define SEER_DEFAULT_ORT_LIBRARY ""
#endif

namespace seer {
namespace {

// Graphs called step after step may spin their thread pools between calls; a spinning idle pool of a one-off
// graph (embed, vision, step_zero) slows the steps after it (seer_trt/backends/onnxruntime.py LOOP_GRAPHS).
const char* const LOOP_GRAPHS[] = {"denoise", "denoise_logits"};

std::mutex load_mutex;
std::string loaded_library;  // guarded by load_mutex
std::string loaded_version;  // of the library (Ort::GetVersionString would call OrtGetApiBase, which is not linked)
Ort::Env* env = nullptr;     // one per process, never destroyed (ONNX Runtime outlives every pipeline)

std::string default_library() {
  if (const char* env_path = std::getenv("SEER_ORT_LIBRARY"); env_path && *env_path) return env_path;
  if (*SEER_DEFAULT_ORT_LIBRARY && access(SEER_DEFAULT_ORT_LIBRARY, R_OK) == 0) return SEER_DEFAULT_ORT_LIBRARY;
  return "libonnxruntime.so";
}

// dlopen the library, Ort::InitApi with its API at this header's version, the process's Env.
void load(const std::string& requested) {
  std::lock_guard<std::mutex> lock(load_mutex);
  const std::string path = requested.empty() ? default_library() : requested;
  if (!loaded_library.empty()) {
    if (!requested.empty() && path != loaded_library)
      throw config_error("ONNX Runtime is already loaded from " + loaded_library + " in this process, not " + path +
                         "; one process holds one ONNX Runtime: open every pipeline with the same ort_library");
    return;
  }
  // ONNX Runtime's telemetry (a device id and an event queue under ~/.cache/Microsoft) off unless the process set
  // ORT_DISABLE_TELEMETRY itself (0 turns it on), as in Python: docs/DESIGN.md "Telemetry"
  setenv("ORT_DISABLE_TELEMETRY", "1", 0);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw config_error("cannot load ONNX Runtime from '" + path + "' (" + dlerror() +
                       "); pass the path of libonnxruntime.so (Options::ort_library, --ort-library or "
                       "$SEER_ORT_LIBRARY)");
  using GetApiBase = const OrtApiBase* (*)();
  auto get_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
  if (!get_base) throw config_error(path + " has no OrtGetApiBase: it is not an ONNX Runtime library");
  const OrtApiBase* base = get_base();
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api)
    throw config_error("ONNX Runtime " + std::string(base->GetVersionString()) + " at " + path +
                       " does not offer API version " + std::to_string(ORT_API_VERSION) +
                       " (this build's headers are 1." + std::to_string(ORT_API_VERSION) +
                       "); use ONNX Runtime >= 1." + std::to_string(ORT_API_VERSION) +
                       ", or rebuild against older headers (tools/ort_sdk.sh --suite trixie)");
  Ort::InitApi(api);
  loaded_version = base->GetVersionString();
  env = new Ort::Env(ORT_LOGGING_LEVEL_ERROR, "seer");
  loaded_library = path;
}

}  // namespace

ONNXTensorElementDataType element_type(const std::string& dtype) {
  static const std::map<std::string, ONNXTensorElementDataType> types = {
      {"float32", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, {"float16", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
      {"bfloat16", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}, {"float64", ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE},
      {"int64", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64}, {"int32", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32},
      {"int8", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8}, {"uint8", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8},
      {"bool", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL}};
  auto it = types.find(dtype);
  if (it == types.end()) throw manifest_error("dtype '" + dtype + "' is not one this runtime reads; re-export");
  return it->second;
}

size_t element_size(const std::string& dtype) {
  switch (element_type(dtype)) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: return 8;
  }
}

Ort::Value GraphCall::bind(void* data, const std::string& dtype, const std::vector<int64_t>& shape) {
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  size_t count = 1;
  for (int64_t s : shape) count *= static_cast<size_t>(s);
  return Ort::Value::CreateTensor(cpu, data, count * element_size(dtype), shape.data(), shape.size(),
                                  element_type(dtype));
}

void GraphCall::input(const char* name, void* data, const std::string& dtype, std::vector<int64_t> shape) {
  in_names_.push_back(name);
  in_values_.push_back(bind(data, dtype, shape));
}

void GraphCall::output(const char* name, void* data, const std::string& dtype, std::vector<int64_t> shape) {
  out_names_.push_back(name);
  out_values_.push_back(bind(data, dtype, shape));
}

void GraphCall::run() {
  const auto start = std::chrono::steady_clock::now();
  try {
    session_->Run(Ort::RunOptions{nullptr}, in_names_.data(), in_values_.data(), in_values_.size(),
                  out_names_.data(), out_values_.data(), out_values_.size());
  } catch (const Ort::Exception& err) {
    throw Error(Error::Kind::Runtime, std::string("ONNX Runtime failed to run a graph (") + err.what() + ")");
  }
  *clock_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

// weights.data, memory-mapped read-only: its pages are read on first use and shared with other processes.
struct Backend::Mapping {
  void* data = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (data != MAP_FAILED) munmap(data, size);
  }
};

Backend::Backend(const std::string& folder, const Manifest& manifest, const Options& options,
                 const std::vector<std::string>& graphs) {
  load(options.ort_library);
  static const std::map<std::string, std::string> providers = {
      {"cpu", "CPUExecutionProvider"}, {"cuda", "CUDAExecutionProvider"}, {"tensorrt", "TensorrtExecutionProvider"}};
  auto provider = providers.find(options.provider);
  if (provider == providers.end())
    throw config_error("unknown provider '" + options.provider + "'; choose cpu, cuda or tensorrt");
  const auto available = Ort::GetAvailableProviders();
  if (std::find(available.begin(), available.end(), provider->second) == available.end()) {
    std::string have;
    for (const auto& p : available) have += (have.empty() ? "" : ", ") + p;
 throw config_error("ONNX Runtime " + loaded_version + " (" + loaded_library + ") offers " + have + ", not " +
                       provider->second + "; point ort_library at a build with it (onnxruntime-gpu's "
                       "libonnxruntime.so), or use the cpu provider");
  }
  if (options.threads < 0)
    throw config_error("threads is " + std::to_string(options.threads) + "; expected >= 0 (0: ONNX Runtime's default)");
  const bool share = options.share_weights && options.provider == "cpu" && manifest.weights.has_value();
  if (share) {
    const WeightsInfo& info = *manifest.weights;
    const std::string path = export_path(folder, info.file, "weights.file");
    weights_ = std::make_unique<Mapping>();
    struct stat st {};
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
      close(fd);
      throw manifest_error("export " + folder + ": weights.file " + info.file +
                           " is not a regular file (a FIFO, device, socket or folder); re-export with seer-export");
    }
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size != info.size_bytes) {
      if (fd >= 0) close(fd);
      throw manifest_error(path + " is " + (fd < 0 ? std::string("missing") : std::to_string(st.st_size) + " bytes") +
                           ", the manifest says " + std::to_string(info.size_bytes) +
                           " bytes; re-export with seer-export --out " + folder);
    }
    weights_->size = static_cast<size_t>(st.st_size);
    weights_->data = weights_->size ? mmap(nullptr, weights_->size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (weights_->size && weights_->data == MAP_FAILED) throw manifest_error("cannot map " + path + " into memory");
    const std::string index_path = export_path(folder, info.index, "weights.index");
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_bounded(index_path, folder, "weights.index", MAX_INDEX_BYTES));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& err) {
      throw manifest_error(index_path + " (the shared weights' index) is not readable (" + err.what() +
                           "); re-export with seer-export");
    }
    static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    names_.reserve(index.size());
    for (const auto& [name, entry] : index.items()) {
      int64_t offset, length;
      std::string dtype;
      std::vector<int64_t> shape;
      try {
        offset = entry.at(0).get<int64_t>();
        length = entry.at(1).get<int64_t>();
        dtype = entry.at(2).get<std::string>();
        shape = entry.at(3).get<std::vector<int64_t>>();
      } catch (const nlohmann::json::exception&) {
        throw manifest_error(index_path + ": entry '" + name + "' is not [offset, length, dtype, shape]; re-export");
      }
      int64_t count = 1;
      for (int64_t s : shape) count = s < 0 ? -1 : count * s;
      if (offset < 0 || length < 0 || offset + length > info.size_bytes || count < 0 ||
          static_cast<size_t>(count) * element_size(dtype) != static_cast<size_t>(length))
        throw manifest_error(index_path + ": tensor '" + name + "' lies outside " + path +
                             " or its length does not match its shape; re-export with seer-export");
      char* data = static_cast<char*>(weights_->data) + offset;
      // ONNX Runtime only reads an initializer; the mapping is read-only, so a write would fault, not corrupt
      shared_.push_back(Ort::Value::CreateTensor(cpu, data, static_cast<size_t>(length), shape.data(), shape.size(),
                                                 element_type(dtype)));
      names_.push_back(name);
    }
  }
  for (const std::string& graph : graphs) {
    const GraphEntry& entry = manifest.graph(graph);
    Ort::SessionOptions so;
    so.SetLogSeverityLevel(3);
    if (options.threads) so.SetIntraOpNumThreads(options.threads);
    if (std::find(std::begin(LOOP_GRAPHS), std::end(LOOP_GRAPHS), graph) == std::end(LOOP_GRAPHS))
      so.AddConfigEntry("session.intra_op.allow_spinning", "0");
    if (share) {
      so.AddConfigEntry("session.disable_prepacking", "1");  // else a packed copy of every weight per session
      for (size_t i = 0; i < shared_.size(); ++i) so.AddInitializer(names_[i].c_str(), shared_[i]);
    }
    try {
      if (options.provider == "cuda") {
        OrtCUDAProviderOptions cuda{};
        cuda.device_id = options.device_id;
        so.AppendExecutionProvider_CUDA(cuda);
      } else if (options.provider == "tensorrt") {
        OrtTensorRTProviderOptions trt{};
        trt.device_id = options.device_id;
        so.AppendExecutionProvider_TensorRT(trt);
      }
    } catch (const Ort::Exception& err) {
      throw config_error("ONNX Runtime cannot use the " + options.provider + " provider (" + err.what() +
                         "); check its CUDA / TensorRT libraries, or use the cpu provider");
    }
    const std::string path = export_path(folder, entry.file, "graphs." + graph + ".file", true);
    try {
      sessions_[graph] = std::make_unique<Ort::Session>(*env, path.c_str(), so);
    } catch (const Ort::Exception& err) {
      throw manifest_error("graph '" + graph + "': " + path + " does not load (" + err.what() +
                           "); re-export with seer-export");
    }
    check_io(entry, *sessions_[graph]);
  }
}

Backend::~Backend() = default;

void Backend::check_io(const GraphEntry& entry, Ort::Session& session) {
  Ort::AllocatorWithDefaultOptions alloc;
  auto describe = [&](bool inputs) {
    std::string out;
    const size_t n = inputs ? session.GetInputCount() : session.GetOutputCount();
    for (size_t i = 0; i < n; ++i) {
      auto name = inputs ? session.GetInputNameAllocated(i, alloc) : session.GetOutputNameAllocated(i, alloc);
      auto info = inputs ? session.GetInputTypeInfo(i) : session.GetOutputTypeInfo(i);
      out += std::string(out.empty() ? "" : ", ") + name.get() + ":" +
             std::to_string(static_cast<int>(info.GetTensorTypeAndShapeInfo().GetElementType()));
    }
    return out;
  };
  auto expected = [&](const std::vector<TensorSpec>& specs) {
    std::string out;
    for (const auto& t : specs)
      out += std::string(out.empty() ? "" : ", ") + t.name + ":" + std::to_string(static_cast<int>(element_type(t.dtype)));
    return out;
  };
  const std::string found = describe(true) + " -> " + describe(false);
  const std::string want = expected(entry.inputs) + " -> " + expected(entry.outputs);
  if (found != want)
    throw manifest_error("graph '" + entry.name + "' does not match the manifest: the file has " + found +
                         ", the manifest " + want + " (name:ONNX type); re-export with seer-export");
}

GraphCall Backend::call(const std::string& graph, std::atomic<int64_t>* clock) {
  auto it = sessions_.find(graph);
  if (it == sessions_.end()) throw config_error("graph '" + graph + "' was not opened");
  return GraphCall(*it->second, clock);
}

std::string Backend::version() {
  std::lock_guard<std::mutex> lock(load_mutex);
  return loaded_version;
}

}  // namespace seer
