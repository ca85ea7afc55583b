// CUDA-graph replay for reduce-overhead / max-autotune packages, as aotc_runtime/cuda_graphs.py
// does it: per input signature (shapes, dtypes), warm up on a side stream, capture one call with
// static input buffers into a graph (one memory pool for all of a package's graphs), then copy
// inputs in and replay. Outputs are fresh copies unless reuse_outputs; a signature whose capture
// fails runs plain calls, with one warning on stderr.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace aotc {

using FlatCall = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

class CudaGraphs {
 public:
  virtual ~CudaGraphs() = default;
  virtual std::vector<at::Tensor> run(const std::vector<at::Tensor>& flat) = 0;
  virtual size_t captured() const = 0;
};

// nullptr where this build has no CUDA (CUDA packages are refused before this point there).
// The last `written_inputs` inputs are ones the program updates in place (a package's state): a
// replay writes their static buffers, which are copied back to the caller's.
std::unique_ptr<CudaGraphs> make_cuda_graphs(FlatCall call, at::Device device, bool reuse_outputs,
                                             size_t written_inputs = 0);

// One step of a loop captured as a CUDA graph on buffers the caller keeps (generation's decode
// step, as aotc_runtime/cuda_graphs.py DecodeGraph): `program` (run twice on a side stream first,
// to warm up), then `after` (run only inside the graph: the step's inputs advanced for the next).
// replay() runs both and returns the tensor `program` returned at capture, overwritten by the next
// replay.
class CapturedStep {
 public:
  virtual ~CapturedStep() = default;
  virtual at::Tensor replay() = 0;
};

// nullptr, with one warning on stderr, where capture fails (or this build has no CUDA).
std::unique_ptr<CapturedStep> capture_step(const std::function<at::Tensor()>& program, const std::function<void()>& after,
                                           at::Device device);

}  // namespace aotc
