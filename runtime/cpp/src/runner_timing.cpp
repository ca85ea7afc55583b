#include <algorithm>
#include <cmath>
#include <numeric>

#include "runner.h"

#ifdef AOTC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace aotc::runner {

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

void synchronize(const at::Device& device) {
#ifdef AOTC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

std::optional<int> parse_calls(const std::string& text) {
  // Digits only (no sign, no spaces, no exponent), and few enough that the value cannot overflow.
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  int value = std::stoi(text);
  if (value > kMaxCalls) return std::nullopt;
  return value;
}

// Milliseconds per call; on CUDA also `host`: the CPU time of each call (issuing work; the rest of
// the call's time is the GPU's), measured between the same events without waiting for the GPU.
std::vector<double> time_calls(Package& package, const std::vector<at::Tensor>& inputs, int iters, int warmup,
                               std::vector<double>* host) {
  for (int i = 0; i < warmup; ++i) package.run(inputs);
  std::vector<double> samples;
#ifdef AOTC_WITH_CUDA
  if (package.device().is_cuda()) {
    // CUDA events around each call, as aotc_runtime.time_calls: what the stream saw, launch gaps included.
    std::vector<at::cuda::CUDAEvent> starts, ends;  // timing events (the default kind does not time)
    for (int i = 0; i < iters; ++i) {
      starts.emplace_back(cudaEventDefault);
      ends.emplace_back(cudaEventDefault);
    }
    synchronize(package.device());
    for (int i = 0; i < iters; ++i) {
      starts[i].record();
      auto issued = Clock::now();
      package.run(inputs);
      if (host) host->push_back(ms_since(issued));
      ends[i].record();
    }
    synchronize(package.device());
    for (int i = 0; i < iters; ++i) samples.push_back(starts[i].elapsed_time(ends[i]));
    return samples;
  }
#endif
  for (int i = 0; i < iters; ++i) {
    auto start = Clock::now();
    package.run(inputs);
    samples.push_back(ms_since(start));
  }
  return samples;
}

nlohmann::json summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  size_t n = samples.size();
  auto percentile = [&](double fraction) {
    long rank = std::lround(fraction * static_cast<double>(n) + 0.5) - 1;
    return samples[static_cast<size_t>(std::clamp<long>(rank, 0, static_cast<long>(n) - 1))];
  };
  double median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  double mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  double var = 0;
  for (double s : samples) var += (s - mean) * (s - mean);
  double stdev = n > 1 ? std::sqrt(var / static_cast<double>(n - 1)) : 0.0;
  return {{"n", n}, {"median_ms", median}, {"p90_ms", percentile(0.90)}, {"p99_ms", percentile(0.99)},
          {"min_ms", samples.front()}, {"stdev_ms", stdev}};
}

}  // namespace aotc::runner
