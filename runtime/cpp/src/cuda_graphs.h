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
std::unique_ptr<CudaGraphs> make_cuda_graphs(FlatCall call, at::Device device, bool reuse_outputs);

}  // namespace aotc
