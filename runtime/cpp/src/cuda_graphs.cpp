#include "cuda_graphs.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#ifdef AOTC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace aotc {

#ifdef AOTC_WITH_CUDA
namespace {

constexpr int kWarmupCalls = 2;  // the first calls allocate workspaces and pick algorithms; capture after them

using Key = std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>;

// `waiter` runs what is queued after this only once `done` finished what is queued on it now.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

struct Graph {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::vector<at::Tensor> static_inputs, static_outputs;
};

class CudaGraphRunner : public CudaGraphs {
 public:
  CudaGraphRunner(FlatCall call, at::Device device, bool reuse_outputs, size_t written_inputs)
      : call_(std::move(call)), device_(device), reuse_outputs_(reuse_outputs), written_inputs_(written_inputs) {}

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& flat) override {
    Key key;
    for (const auto& t : flat) key.emplace_back(t.sizes().vec(), t.scalar_type());
    auto found = graphs_.find(key);
    if (found == graphs_.end()) {
      if (uncapturable_.count(key) || !capture(key, flat)) return call_(flat);
      found = graphs_.find(key);
    }
    Graph& entry = found->second;
    for (size_t i = 0; i < flat.size(); ++i) entry.static_inputs[i].copy_(flat[i], /*non_blocking=*/true);
    entry.graph->replay();
    for (size_t i = flat.size() - std::min(written_inputs_, flat.size()); i < flat.size(); ++i) {
      flat[i].copy_(entry.static_inputs[i], /*non_blocking=*/true);
    }
    if (reuse_outputs_) return entry.static_outputs;
    std::vector<at::Tensor> fresh;
    for (const auto& out : entry.static_outputs) fresh.push_back(out.clone());
    return fresh;
  }

  size_t captured() const override { return graphs_.size(); }

 private:
  bool capture(const Key& key, const std::vector<at::Tensor>& flat) {
    Graph entry;
    for (const auto& t : flat) entry.static_inputs.push_back(t.detach().clone());
    try {
      c10::cuda::CUDAGuard guard(device_);
      auto current = c10::cuda::getCurrentCUDAStream(device_.index());
      auto side = c10::cuda::getStreamFromPool(false, device_.index());
      {
        c10::cuda::CUDAStreamGuard on_side(side);
        wait_for(side, current);  // run after what was queued before
        for (int i = 0; i < kWarmupCalls; ++i) call_(entry.static_inputs);
      }
      wait_for(current, side);
      if (!pool_set_) {
        pool_ = at::cuda::graph_pool_handle();
        pool_set_ = true;
      }
      c10::cuda::device_synchronize();  // as torch.cuda.graph does: nothing in flight while capturing
      entry.graph = std::make_unique<at::cuda::CUDAGraph>();
      auto capture_stream = c10::cuda::getStreamFromPool(false, device_.index());
      {
        c10::cuda::CUDAStreamGuard on_capture(capture_stream);
        wait_for(capture_stream, current);
        entry.graph->capture_begin(pool_);
        entry.static_outputs = call_(entry.static_inputs);
        entry.graph->capture_end();
      }
      wait_for(current, capture_stream);
    } catch (const std::exception& exc) {  // capture is an optimisation: never fail the call because of it
      uncapturable_.insert(key);
      std::string what = exc.what();
      std::cerr << "aotc-runner: CUDA-graph capture failed (" << what.substr(0, what.find('\n'))
                << "); running without graphs" << std::endl;
      c10::cuda::device_synchronize();
      return false;
    }
    graphs_.emplace(key, std::move(entry));
    return true;
  }

  FlatCall call_;
  at::Device device_;
  bool reuse_outputs_;
  size_t written_inputs_;
  std::map<Key, Graph> graphs_;
  std::set<Key> uncapturable_;
  at::cuda::MempoolId_t pool_{0, 0};
  bool pool_set_ = false;
};

class GraphStep : public CapturedStep {
 public:
  GraphStep(std::unique_ptr<at::cuda::CUDAGraph> graph, at::Tensor result) : graph_(std::move(graph)), result_(std::move(result)) {}
  at::Tensor replay() override {
    graph_->replay();
    return result_;
  }

 private:
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  at::Tensor result_;
};

}  // namespace

std::unique_ptr<CapturedStep> capture_step(const std::function<at::Tensor()>& program, const std::function<void()>& after,
                                           at::Device device) {
  try {
    c10::cuda::CUDAGuard guard(device);
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    auto side = c10::cuda::getStreamFromPool(false, device.index());
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      wait_for(side, current);
      for (int i = 0; i < kWarmupCalls; ++i) program();
    }
    wait_for(current, side);
    c10::cuda::device_synchronize();  // as torch.cuda.graph does: nothing in flight while capturing
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    auto capture_stream = c10::cuda::getStreamFromPool(false, device.index());
    at::Tensor result;
    {
      c10::cuda::CUDAStreamGuard on_capture(capture_stream);
      wait_for(capture_stream, current);
      graph->capture_begin();
      result = program();
      after();
      graph->capture_end();
    }
    wait_for(current, capture_stream);
    return std::make_unique<GraphStep>(std::move(graph), std::move(result));
  } catch (const std::exception& exc) {  // capture is an optimisation: never fail the call because of it
    std::string what = exc.what();
    std::cerr << "aotc-runner: CUDA-graph capture of the decode step failed (" << what.substr(0, what.find('\n'))
              << "); decoding without graphs" << std::endl;
    c10::cuda::device_synchronize();
    return nullptr;
  }
}

std::unique_ptr<CudaGraphs> make_cuda_graphs(FlatCall call, at::Device device, bool reuse_outputs,
                                             size_t written_inputs) {
  return std::make_unique<CudaGraphRunner>(std::move(call), device, reuse_outputs, written_inputs);
}
#else
std::unique_ptr<CudaGraphs> make_cuda_graphs(FlatCall, at::Device, bool, size_t) { return nullptr; }
std::unique_ptr<CapturedStep> capture_step(const std::function<at::Tensor()>&, const std::function<void()>&, at::Device) {
  return nullptr;
}
#endif

}  // namespace aotc
