// What the parts of aotc-runner share (runner_main.cpp: the command line and the report;
// runner_serve.cpp: --serve; runner_timing.cpp: timed calls; runner_cleanup.cpp: signals and the
// temporary folder). Not part of the aotc::runtime library.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "aotc/package.h"

namespace aotc::runner {

using Clock = std::chrono::steady_clock;

// The most calls one --iters, --warmup or `time N WARMUP` may ask for: a million calls of the
// smallest model take minutes; a mistyped count must not keep a machine busy for hours.
constexpr int kMaxCalls = 1000000;

double ms_since(Clock::time_point start);
void synchronize(const at::Device& device);

// Milliseconds per call, after `warmup` untimed calls; on CUDA also `host`: the CPU time of each call.
std::vector<double> time_calls(Package& package, const std::vector<at::Tensor>& inputs, int iters, int warmup,
                               std::vector<double>* host = nullptr);

// Nearest-rank percentiles and sample stdev, as aotc_runtime.summarize.
nlohmann::json summarize(std::vector<double> samples);

// `--serve`: answer commands on stdin until `quit` or end of input; returns the exit code.
int serve(Package& package);

// A count from text: digits only, 0 to kMaxCalls; nullopt otherwise.
std::optional<int> parse_calls(const std::string& text);

}  // namespace aotc::runner
