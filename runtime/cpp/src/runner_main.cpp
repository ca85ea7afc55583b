// aotc-runner: run an aotc package with no Python, the way `aotc run` / `aotc-run` do.
//
//   aotc-runner PKG/ [--input a.npy ...] [--output out.npz] [--iters N] [--warmup N] [--seed N] [--json]
//                    [--require-signature --public-key KEY.pub.pem] [--serve] [--threads N]
//   aotc-runner PKG/ --generate --prompt-ids 5,17,42 [--prompt-ids ...] [--max-new-tokens N]
//                    [--temperature T --top-k K --top-p P --seed S] [--stream] [--json] [--threads N]
//
// Errors are one line on stderr (`error: ...`) with the exit codes of the Python runtime.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "aotc/inputs.h"
#include "aotc/npy.h"
#include "aotc/package.h"
#include "aotc/threads.h"
#include "runner.h"
#include "runner_args.h"
#include "runner_cleanup.h"

using nlohmann::json;
using namespace aotc::runner;

namespace {

const auto kProcessStart = Clock::now();

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

// --generate: the prompts left-padded into one batch, as `aotc generate` (aotc/cli/generate.py)
// pads them, then Package::generate, with the same report.
int generate(aotc::Package& package, const Args& args, int threads) {
  size_t longest = 0;
  for (const auto& prompt : args.prompts) longest = std::max(longest, prompt.size());
  const auto rows = static_cast<int64_t>(args.prompts.size()), width = static_cast<int64_t>(longest);
  at::Tensor ids = at::zeros({rows, width}, at::kLong), mask = at::zeros({rows, width}, at::kLong);
  for (int64_t row = 0; row < rows; ++row) {
    const auto& prompt = args.prompts[row];
    int64_t start = width - static_cast<int64_t>(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) {
      ids[row][start + static_cast<int64_t>(i)] = prompt[i];
      mask[row][start + static_cast<int64_t>(i)] = 1;
    }
  }
  aotc::GenerationRequest request = args.generation;
  request.sampling.seed = args.seed;
  std::vector<Clock::time_point> stamps;
  auto started = Clock::now();
  auto generated = package.generate(ids, mask, request, [&](const std::vector<int64_t>& tokens) {
    stamps.push_back(Clock::now());
    if (args.stream && !args.as_json) {
      for (size_t i = 0; i < tokens.size(); ++i) std::cout << (i ? " " : "") << tokens[i];
      std::cout << std::endl;
    }
  });
  // the timings of `aotc generate`: the first token (prefill), then the gaps between steps
  std::vector<double> steps;
  for (size_t i = 1; i < stamps.size(); ++i) steps.push_back(std::chrono::duration<double, std::milli>(stamps[i] - stamps[i - 1]).count());
  double total = 0;
  for (double step : steps) total += step;
  json decode = steps.empty() ? json::object() : summarize(steps);
  json timings = {
      {"first_token_ms", stamps.empty() ? json(nullptr) : json(std::chrono::duration<double, std::milli>(stamps[0] - started).count())},
      {"decode_steps", steps.size()},
      {"decode_tokens_per_s", total > 0 ? 1e3 * static_cast<double>(steps.size()) / total : 0.0},
      {"decode_p50_ms", decode.value("median_ms", 0.0)},
      {"decode_p99_ms", decode.value("p99_ms", 0.0)},
      {"threads", threads},  // the CPU threads the steps ran with (--threads, else the default rule)
      // from process start (static initialisation) to the first token: the runner's cold start
      {"process_to_first_token_ms", stamps.empty() ? json(nullptr) : json(std::chrono::duration<double, std::milli>(stamps[0] - kProcessStart).count())},
  };
  if (args.as_json) {
    std::cout << json({{"generated_ids", generated}, {"timings", timings}}).dump() << std::endl;
    return 0;
  }
  if (!args.stream) {
    for (const auto& row : generated) {
      for (size_t i = 0; i < row.size(); ++i) std::cout << (i ? "," : "") << row[i];
      std::cout << "\n";
    }
    std::cout << std::flush;
  }
  // a generation whose every sequence ended at its first token made no decode step: no rate
  char decode_part[160] = "no decode step after it (every sequence ended at its first token)";
  if (!steps.empty())
    std::snprintf(decode_part, sizeof decode_part, "%.1f tokens/s per sequence after it (p50 %.2f ms, p99 %.2f ms)",
                  timings["decode_tokens_per_s"].get<double>(), timings["decode_p50_ms"].get<double>(),
                  timings["decode_p99_ms"].get<double>());
  char line[320];
  std::snprintf(line, sizeof line, "first token %.1f ms; %s; %d CPU thread%s",
                timings["first_token_ms"].is_null() ? 0.0 : timings["first_token_ms"].get<double>(), decode_part,
                threads, threads == 1 ? "" : "s");
  std::cerr << line << std::endl;
  return 0;
}

int run(const Args& args) {
  // first: inter-op threads can be set only before any parallel work
  const int threads = aotc::set_threads(args.threads);
  auto started = Clock::now();
  aotc::LoadTimes times;
  aotc::LoadOptions options;
  options.times = &times;
  options.public_key = args.public_key;  // --public-key alone asks for the check too, as aotc-run
  aotc::Package package = aotc::Package::load(args.package, options);
  if (args.serve) return serve(package);
  if (args.generate) return generate(package, args, threads);
  double load_ms = ms_since(started);
  const auto& signature = package.manifest().signature;
  std::vector<at::Tensor> inputs =
      args.inputs.empty() ? package.random_inputs(args.seed) : aotc::read_inputs(args.inputs, package);
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
    WritingOutput writing(args.output);
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
       {{"manifest", times.manifest_ms}, {"device", times.device_ms}, {"hashes", times.hashes_ms}, {"loader", times.loader_ms}, {"state", times.state_ms}}},
      {"iters", args.iters},
      // the CPU threads each call ran with (--threads, else the default rule); the Python report's
      // "concurrency" names them so too
      {"intra_op_threads", threads},
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
    Args args = parse_args(argc, argv);
    PrivateTemp temp;  // before the package loads: what torch unpacks goes in it, and goes with it
    return run(args);
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
