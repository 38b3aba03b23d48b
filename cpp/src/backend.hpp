// The graphs of an export on ONNX Runtime (seer_trt/backends/onnxruntime.py, docs/DESIGN.md "Graphs and their contract").
//
// In:  the export folder and its Manifest, Options (library path, provider, threads, weight sharing).
// Out: Backend: one shared session per graph, and GraphCall: a call's inputs and outputs bound once to caller
//      memory, run as often as needed with no allocation of ours (the denoising loop rewrites gen_ids in place).
//
// ONNX Runtime is dlopen-ed (ORT_API_MANUAL_INIT): the first pipeline of a process loads it; later ones must
// name the same library. With share_weights (CPU), weights.data is memory-mapped once and every tensor is handed
// to every session as a shared initializer, prepacking off, as the Python backend does.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace seer {

ONNXTensorElementDataType element_type(const std::string& dtype);  // throws manifest_error for an unknown one
size_t element_size(const std::string& dtype);

// One graph call: named inputs and outputs over caller-owned buffers (which must outlive it).
class GraphCall {
 public:
  GraphCall(Ort::Session& session, std::atomic<int64_t>* clock) : session_(&session), clock_(clock) {}
  void input(const char* name, void* data, const std::string& dtype, std::vector<int64_t> shape);
  void output(const char* name, void* data, const std::string& dtype, std::vector<int64_t> shape);
  void run();  // throws Error (Runtime) with ONNX Runtime's message

 private:
  Ort::Value bind(void* data, const std::string& dtype, const std::vector<int64_t>& shape);
  Ort::Session* session_;
  std::atomic<int64_t>* clock_;  // nanoseconds spent in Run, added up by the caller's request
  std::vector<const char*> in_names_, out_names_;
  std::vector<Ort::Value> in_values_, out_values_;
};

class Backend {
 public:
  Backend(const std::string& folder, const Manifest& manifest, const Options& options,
          const std::vector<std::string>& graphs);
  ~Backend();
  GraphCall call(const std::string& graph, std::atomic<int64_t>* clock);
  bool has(const std::string& graph) const { return sessions_.count(graph) > 0; }
  static std::string version();

 private:
  static void check_io(const GraphEntry& entry, Ort::Session& session);  // the file's I/O is the manifest's
  struct Mapping;
  std::unique_ptr<Mapping> weights_;  // before the sessions that use it, so it is released after them
  std::vector<Ort::Value> shared_;   // one per tensor of weights.data, over the mapping
  std::vector<std::string> names_;   // their names
  std::map<std::string, std::unique_ptr<Ort::Session>> sessions_;
};

}  // namespace seer
