// aotc-runner: run an aotc package with no Python, the way `aotc run` / `aotc-run` do.
//
//   aotc-runner PKG/ [--input a.npy ...] [--output out.npz] [--iters N] [--warmup N] [--seed N] [--json]
//
// Errors are one line on stderr (`error: ...`) with the exit codes of the Python runtime.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "aotc/npy.h"
#include "aotc/package.h"

#ifdef AOTC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

const auto kProcessStart = Clock::now();

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

struct Args {
  std::string package, output;
  std::vector<std::string> inputs;
  int iters = 0, warmup = 3;
  uint64_t seed = 0;
  bool as_json = false;
  bool serve = false;
};

const char* kUsage =
    "usage: aotc-runner PKG/ [--input FILE ...] [--output OUT.npz] [--iters N] [--warmup N] [--seed N] [--json] [--serve]\n"
    "Run an aotc package with no Python. Inputs: .npy (one input each) or .npz (several, by position or by\n"
    "input name); default: seeded random inputs. --output writes the outputs to .npz under their names.\n"
    "--serve: keep the package loaded and answer `inputs FILE.npz`, `time N WARMUP`, `quit` on stdin (aotc bench).\n";

int parse_count(const std::string& flag, const std::string& text) {
  size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || value < 0) throw aotc::usage_error(flag + " must be a whole number >= 0, got '" + text + "'");
  return value;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= argc) throw aotc::usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--input") {
      args.inputs.push_back(value(arg));
    } else if (arg == "--output") {
      args.output = value(arg);
    } else if (arg == "--iters") {
      args.iters = parse_count(arg, value(arg));
    } else if (arg == "--warmup") {
      args.warmup = parse_count(arg, value(arg));
    } else if (arg == "--seed") {
      args.seed = static_cast<uint64_t>(parse_count(arg, value(arg)));
    } else if (arg == "--json") {
      args.as_json = true;
    } else if (arg == "--serve") {
      args.serve = true;
    } else if (!arg.empty() && arg[0] == '-') {
      throw aotc::usage_error("unknown option " + arg + "; see aotc-runner --help");
    } else if (args.package.empty()) {
      args.package = arg;
    } else {
      throw aotc::usage_error("one package folder, got a second: " + arg);
    }
  }
  if (args.package.empty()) throw aotc::usage_error("missing the package folder; usage: aotc-runner PKG/ [...]");
  if (!args.output.empty() && (args.output.size() < 4 || args.output.substr(args.output.size() - 4) != ".npz")) {
    throw aotc::input_error("output file " + args.output + " must end in .npz");
  }
  return args;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Inputs in positional order; an .npz whose keys all name inputs goes by name (aotc_runtime.read_inputs).
std::vector<at::Tensor> read_inputs(const std::vector<std::string>& paths, const aotc::Signature& signature) {
  std::vector<at::Tensor> tensors;
  std::set<std::string> names;
  for (const auto& spec : signature.inputs) names.insert(spec.name);
  for (const auto& path : paths) {
    if (ends_with(path, ".npy")) {
      tensors.push_back(aotc::read_npy(path));
    } else if (ends_with(path, ".npz")) {
      auto arrays = aotc::read_npz(path);
      bool by_name = !arrays.empty() && std::all_of(arrays.begin(), arrays.end(), [&](const auto& a) { return names.count(a.first); });
      if (by_name) {
        for (const auto& spec : signature.inputs)
          for (const auto& [name, tensor] : arrays)
            if (name == spec.name) tensors.push_back(tensor);
      } else {
        for (const auto& [name, tensor] : arrays) tensors.push_back(tensor);
      }
    } else {
      size_t dot = path.find_last_of('.');
      std::string suffix = dot == std::string::npos ? "" : path.substr(dot);
      throw aotc::input_error("input file " + path + " has an unknown type '" + suffix + "'; use .npy or .npz");
    }
  }
  return tensors;
}

void synchronize(const at::Device& device) {
#ifdef AOTC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

// Milliseconds per call; on CUDA also `host`: the CPU time of each call (issuing work; the rest of
// the call's time is the GPU's), measured between the same events without waiting for the GPU.
std::vector<double> time_calls(aotc::Package& package, const std::vector<at::Tensor>& inputs, int iters, int warmup,
                               std::vector<double>* host = nullptr) {
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

// The summary of aotc_runtime.summarize: nearest-rank percentiles, sample stdev.
json summarize(std::vector<double> samples) {
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

// "[32, 10]", as Python prints a list.
std::string shape_text(const json& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + shape[i].dump();
  return out + "]";
}

std::string format_report(const json& r) {
  char line[256];
  std::string out = "package   " + r["package"].get<std::string>() + " (" + r["mode"].get<std::string>() + ", " +
                    r["device"].get<std::string>() + ")\n";
  for (const auto& o : r["outputs"]) {
    out += "output    " + o["name"].get<std::string>() + ": " + o["dtype"].get<std::string>() + " " + shape_text(o["shape"]) + "\n";
  }
  std::snprintf(line, sizeof line, "load      %.1f ms\nfirst     %.2f ms\n", r["load_ms"].get<double>(), r["first_call_ms"].get<double>());
  out += line;
  if (!r["latency"].is_null()) {
    const json& lat = r["latency"];
    std::snprintf(line, sizeof line, "latency   median %.3f ms  p90 %.3f ms  p99 %.3f ms  (%zu calls)\n", lat["median_ms"].get<double>(),
                  lat["p90_ms"].get<double>(), lat["p99_ms"].get<double>(), lat["n"].get<size_t>());
    out += line;
  }
  if (r.contains("specializations")) out += "ran       " + r["ran"].get<std::string>() + "\n";
  if (!r["output_file"].is_null()) out += "wrote     " + r["output_file"].get<std::string>() + "\n";
  return out;
}

// `--serve`: keep the package loaded and time calls on request, one JSON line per answer, so that
// `aotc bench --against cpp` can interleave the runner's timed calls with in-process contenders.
//   inputs FILE.npz   -> {"first_call_ms": x, "ran": "model.pt2"}   (the inputs for the following
//                        calls; one call made; `ran` as in the --json report)
//   time N W          -> {"samples_ms": [...]}   (W untimed calls, then N timed ones)
//   quit
int serve(aotc::Package& package) {
  c10::InferenceMode inference;
  std::vector<at::Tensor> inputs;
  std::string command;
  std::cout << json({{"ready", true}, {"device", package.device().str()}}).dump() << std::endl;
  while (std::cin >> command) {
    try {
      if (command == "inputs") {
        std::string path;
        std::cin >> path;
        inputs = read_inputs({path}, package.manifest().signature);
        for (auto& t : inputs) t = t.to(package.device());
        auto start = Clock::now();
        package.run(inputs);
        synchronize(package.device());
        std::cout << json({{"first_call_ms", ms_since(start)}, {"ran", package.model_for(inputs)}}).dump() << std::endl;
      } else if (command == "time") {
        int count = 0, warmup = 0;
        std::cin >> count >> warmup;
        if (inputs.empty()) throw aotc::usage_error("send `inputs FILE.npz` before `time`");
        std::cout << json({{"samples_ms", time_calls(package, inputs, count, warmup)}}).dump() << std::endl;
      } else if (command == "quit") {
        return 0;
      } else {
        throw aotc::usage_error("unknown command " + command + "; use inputs, time or quit");
      }
    } catch (const aotc::Error& err) {
      std::cout << json({{"error", err.what()}, {"exit_code", err.exit_code()}}).dump() << std::endl;
    }
  }
  return 0;
}

int run(const Args& args) {
  auto started = Clock::now();
  aotc::LoadTimes times;
  aotc::LoadOptions options;
  options.times = &times;
  aotc::Package package = aotc::Package::load(args.package, options);
  if (args.serve) return serve(package);
  double load_ms = ms_since(started);
  const auto& signature = package.manifest().signature;
  std::vector<at::Tensor> inputs =
      args.inputs.empty() ? package.random_inputs(args.seed) : read_inputs(args.inputs, signature);
  for (auto& t : inputs) t = t.to(package.device());  // once here: timed calls measure the package, not copies
  c10::InferenceMode inference;
  auto first_start = Clock::now();
  std::vector<at::Tensor> outputs = package.run(inputs);
  synchronize(package.device());
  double first_ms = ms_since(first_start);
  double first_output_ms = ms_since(kProcessStart);
  json latency = nullptr, host_latency = nullptr;
  if (args.iters > 0) {
    std::vector<double> host;
    latency = summarize(time_calls(package, inputs, args.iters, args.warmup, &host));
    if (!host.empty()) host_latency = summarize(host);
  }
  if (!args.output.empty()) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string name = i < signature.outputs.size() ? signature.outputs[i].name : "output_" + std::to_string(i);
      named.emplace_back(name, outputs[i]);
    }
    aotc::write_npz(args.output, named);
  }
  json report = {
      {"package", args.package},
      {"device", package.device().str()},
      {"mode", package.manifest().mode},
      {"engine", "cpp"},
      {"load_ms", load_ms},
      {"first_call_ms", first_ms},
      // From process start (static initialisation) to the first output: the runner's cold start.
      {"process_to_first_output_ms", first_output_ms},
      {"load_breakdown_ms",
       {{"manifest", times.manifest_ms}, {"hashes", times.hashes_ms}, {"loader", times.loader_ms}, {"state", times.state_ms}}},
      {"iters", args.iters},
      {"cuda_graphs_captured", package.cuda_graphs_captured()},
      // The process-wide TF32 settings the calls ran under (a tf32 package turns both on around its calls).
      {"tf32", {{"cublas", at::globalContext().allowTF32CuBLAS()}, {"cudnn", at::globalContext().allowTF32CuDNN()}}},
      {"latency", latency},
      {"host_latency", host_latency},
      {"output_file", args.output.empty() ? json(nullptr) : json(args.output)},
      // Which model the calls ran: "model.pt2", or the specialized member for these inputs' sizes.
      {"ran", package.model_for(inputs)},
  };
  if (!package.manifest().specializations.empty()) {
    json members = json::array();
    for (const auto& spec : package.manifest().specializations) members.push_back({{"dims", spec.dims}, {"package", spec.package}});
    report["specializations"] = members;
  }
  if (args.inputs.empty()) report["inputs"] = "random (seed " + std::to_string(args.seed) + ")";
  else report["inputs"] = args.inputs;
  json outs = json::array();
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string name = i < signature.outputs.size() ? signature.outputs[i].name : "output_" + std::to_string(i);
    outs.push_back({{"name", name}, {"shape", outputs[i].sizes().vec()}, {"dtype", aotc::dtype_name(outputs[i].scalar_type())}});
  }
  report["outputs"] = outs;
  std::cout << (args.as_json ? report.dump(2) + "\n" : format_report(report)) << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const aotc::Error& err) {
    std::cerr << "error: " << err.what() << std::endl;
    return err.exit_code();
  } catch (const std::exception& exc) {
    // A failure inside torch or the compiled model: its first line, not the C++ frames after it.
    std::string what = exc.what();
    std::cerr << "error: the package failed to run: " << what.substr(0, what.find('\n'))
              << "; rerun `aotc run` on it for the Python runtime's view, and report it" << std::endl;
    return 1;
  }
}
