// aotc-runner's flags (runner_args.h). Numbers are read whole: digits only for counts, ids and
// seeds (no sign, fraction, exponent or spaces: `--top-k 2.7` is refused, never run as 2), and
// finite decimals in the ranges of aotc_runtime/sampling.py (aotc/sampling.h) for sampling.
#include "runner_args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>

#include "aotc/threads.h"
#include "runner.h"

namespace aotc::runner {
namespace {

const char* kUsage =
    "usage: aotc-runner PKG/ [--input FILE ...] [--output OUT.npz] [--iters N] [--warmup N] [--seed N] [--json]\n"
    "                        [--require-signature --public-key KEY.pub.pem] [--serve] [--threads N]\n"
    "Run an aotc package with no Python. Inputs: .npy (the next input) or .npz (the inputs its entries name, or\n"
    "arr_0, arr_1... in order); default: seeded random inputs. --output writes the outputs to .npz under their\n"
    "names. --iters/--warmup: 0 to 1000000. --seed: 0 to 2**64-1. --public-key: refuse the package unless its\n"
    "private key signed it (`aotc sign`); --require-signature makes the key mandatory.\n"
    "--serve: keep the package loaded and answer `inputs FILE.npz`, `time N WARMUP`, `quit` on stdin (aotc bench).\n"
    "--threads N: CPU threads of the package's calls (1 to 1024); default: one per physical core this process may\n"
    "use (its CPU affinity and cgroup quota), or OMP_NUM_THREADS when set. Reported as `threads`.\n"
    "--generate: new tokens from a text-generation package, as `aotc generate`: --prompt-ids 5,17,42 (repeat for a\n"
    "batch; left-padded), --max-new-tokens N (32), --temperature T (0: greedy, or 0.01 to 100), --top-k K (1 to\n"
    "2**31-1), --top-p P (1e-06 to 1), --seed S, --stream (each step's tokens as they come), --json\n"
    "({\"generated_ids\": [[...]], \"timings\": {...}}). --input, --output, --iters, --warmup and --serve do not go\n"
    "with --generate.\n";

constexpr int64_t kMaxNewTokens = 1000000000;  // far past any cache; a typo must not read as "forever"

// The flags of a run on input files (or random inputs) and those of a generation: one kind per command.
const std::vector<std::string> kRunFlags = {"--input", "--output", "--iters", "--warmup", "--serve"};
const std::vector<std::string> kGenerateFlags = {"--prompt-ids", "--stream", "--max-new-tokens", "--temperature", "--top-k", "--top-p"};

// Digits only, at most `high`, with no overflow on the way; nullopt otherwise.
std::optional<uint64_t> whole_number(const std::string& text, uint64_t high) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    auto digit = static_cast<uint64_t>(c - '0');
    if (value > (high - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

int64_t parse_whole(const std::string& flag, const std::string& text, int64_t low, int64_t high) {
  std::optional<uint64_t> value = whole_number(text, static_cast<uint64_t>(high));
  if (!value || static_cast<int64_t>(*value) < low) {
    throw usage_error(flag + " must be a whole number from " + std::to_string(low) + " to " + std::to_string(high) + ", got '" + text + "'");
  }
  return static_cast<int64_t>(*value);
}

uint64_t parse_seed(const std::string& text) {
  std::optional<uint64_t> value = whole_number(text, std::numeric_limits<uint64_t>::max());
  if (!value) throw usage_error("--seed must be a whole number from 0 to 2**64-1 (18446744073709551615), got '" + text + "'");
  return *value;
}

// A finite decimal number ("0.9", "1e-3"); not "nan", "inf", hex or text with spaces, which strtod takes.
std::optional<double> finite_number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789.eE+-") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

double parse_temperature(const std::string& text) {
  std::optional<double> value = finite_number(text);
  if (!value || !(*value == 0.0 || (*value >= kMinTemperature && *value <= kMaxTemperature))) {
    throw usage_error("--temperature must be 0 (greedy) or a number from 0.01 to 100, got '" + text + "'");
  }
  return *value;
}

double parse_top_p(const std::string& text) {
  std::optional<double> value = finite_number(text);
  if (!value || !(*value >= kMinTopP && *value <= 1.0)) throw usage_error("--top-p must be a number from 1e-06 to 1, got '" + text + "'");
  return *value;
}

// The same words as aotc_runtime.threads.parse_threads.
int parse_threads(const std::string& text) {
  std::optional<uint64_t> value = whole_number(text, static_cast<uint64_t>(kMaxThreads));
  if (!value || *value < 1) {
    throw usage_error("--threads must be a whole number from 1 to " + std::to_string(kMaxThreads) +
                      " (the CPU threads to use), got '" + text + "'; leave it out for one thread per free physical core (" +
                      std::to_string(default_threads()) + " here now)");
  }
  return static_cast<int>(*value);
}

int parse_count(const std::string& flag, const std::string& text) {
  std::optional<int> value = parse_calls(text);
  if (!value) throw usage_error(flag + " must be a whole number from 0 to " + std::to_string(kMaxCalls) + ", got '" + text + "'");
  return *value;
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(start, end - start);
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    if (!part.empty()) {
      size_t used = 0;
      long long id = 0;
      try {
        id = std::stoll(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != part.size()) throw usage_error("--prompt-ids '" + text + "' is not a comma-separated list of token ids (5,17,42)");
      ids.push_back(id);
    }
    start = end + 1;
  }
  if (ids.empty()) throw usage_error("a prompt is empty (no tokens); give at least one token");
  return ids;
}

bool one_of(const std::vector<std::string>& flags, const std::string& flag) {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

// One flag (and its value, through `value`) into `args`; false for an argument that is not a flag.
bool read_flag(Args& args, const std::string& arg, const std::function<std::string()>& value) {
  if (arg == "--input") args.inputs.push_back(value());
  else if (arg == "--output") args.output = value();
  else if (arg == "--iters") args.iters = parse_count(arg, value());
  else if (arg == "--warmup") args.warmup = parse_count(arg, value());
  else if (arg == "--seed") args.seed = parse_seed(value());
  else if (arg == "--json") args.as_json = true;
  else if (arg == "--generate") args.generate = true;
  else if (arg == "--stream") args.stream = true;
  else if (arg == "--prompt-ids") args.prompts.push_back(parse_ids(value()));
  else if (arg == "--max-new-tokens") args.generation.max_new_tokens = parse_whole(arg, value(), 1, kMaxNewTokens);
  else if (arg == "--temperature") args.generation.sampling.temperature = parse_temperature(value());
  else if (arg == "--top-k") args.generation.sampling.top_k = parse_whole(arg, value(), 1, kMaxTopK);
  else if (arg == "--top-p") args.generation.sampling.top_p = parse_top_p(value());
  else if (arg == "--serve") args.serve = true;
  else if (arg == "--threads") args.threads = parse_threads(value());
  else if (arg == "--require-signature") args.require_signature = true;
  else if (arg == "--public-key") {
    // One key: a bundle's launcher passes its own first, and a second must not replace it.
    if (!args.public_key.empty()) throw usage_error("--public-key is given twice; pass one key");
    args.public_key = value();
    if (args.public_key.empty()) throw usage_error("--public-key needs a file, got ''");
  } else return false;
  return true;
}

// The flags given, checked together: one kind of run, and what each kind needs.
void check_together(const Args& args, const std::vector<std::string>& given) {
  if (args.package.empty()) throw usage_error("missing the package folder; usage: aotc-runner PKG/ [...]");
  for (const auto& flag : given) {
    if (args.generate && one_of(kRunFlags, flag)) {
      throw usage_error(flag + " does not go with --generate (a generation reads --prompt-ids and prints tokens); drop one of them");
    }
    if (!args.generate && one_of(kGenerateFlags, flag)) throw usage_error(flag + " goes with --generate (a text-generation package)");
  }
  if (args.generate && args.prompts.empty()) throw usage_error("--generate needs the prompts: --prompt-ids 5,17,42");
  if (args.require_signature && args.public_key.empty()) {
    throw usage_error("--require-signature needs --public-key PEM: the key the package must be signed with");
  }
  if (!args.output.empty() && (args.output.size() < 4 || args.output.substr(args.output.size() - 4) != ".npz")) {
    throw input_error("output file " + args.output + " must end in .npz");
  }
}

}  // namespace

Args parse_args(int argc, char** argv) {
  Args args;
  args.generation.max_new_tokens = 32;  // as `aotc generate`
  std::vector<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (read_flag(args, arg, value)) {
      given.push_back(arg);
    } else if (!arg.empty() && arg[0] == '-') {
      throw usage_error("unknown option " + arg + "; see aotc-runner --help");
    } else if (args.package.empty()) {
      args.package = arg;
    } else {
      throw usage_error("one package folder, got a second: " + arg);
    }
  }
  check_together(args, given);
  return args;
}

}  // namespace aotc::runner
