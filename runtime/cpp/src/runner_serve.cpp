// `aotc-runner PKG --serve`: keep the package loaded and time calls on request, one JSON line per
// answer, so that `aotc bench --against cpp` (aotc/bench/native.py) can interleave the runner's
// timed calls with in-process contenders. One command per line:
//
//   inputs PATH       -> {"first_call_ms": x, "ran": "model.pt2"}   the inputs for the following
//                        calls (PATH is the rest of the line, spaces included); one call made
//   time N WARMUP     -> {"samples_ms": [...]}   WARMUP untimed calls, then N timed ones (each 0 to 1000000)
//   quit              -> exit 0 (so does the end of input)
//
// Anything else, or a command that fails, is answered with {"error": "...", "exit_code": N} and the
// loop goes on: bytes that are not UTF-8 are replaced in the answer, never a reason to stop.
#include <c10/core/InferenceMode.h>

#include <iostream>

#include "aotc/inputs.h"
#include "runner.h"

namespace aotc::runner {
namespace {

using nlohmann::json;

constexpr size_t kMaxLine = 64 << 10;  // far above any path; a longer line is answered, not kept

void answer(const json& value) {
  // `replace`: a path or command in Latin-1 (or any bytes) is echoed as U+FFFD, not an exception.
  std::cout << value.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

// The next line of stdin without its end ("\n", or "\r\n"); false at the end of input. A line over
// kMaxLine is read to its end but not kept (`too_long`), so one huge line cannot exhaust memory.
bool next_line(std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  int c;
  bool any = false;
  while ((c = std::cin.get()) != EOF) {
    any = true;
    if (c == '\n') break;
    if (line.size() < kMaxLine) line += static_cast<char>(c);
    else too_long = true;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return any;
}

// A command's word and the rest of its line: the text after the blanks that follow the word.
std::pair<std::string, std::string> split(const std::string& line) {
  size_t start = line.find_first_not_of(" \t");
  if (start == std::string::npos) return {"", ""};
  size_t end = line.find_first_of(" \t", start);
  if (end == std::string::npos) return {line.substr(start), ""};
  size_t rest = line.find_first_not_of(" \t", end);
  return {line.substr(start, end - start), rest == std::string::npos ? "" : line.substr(rest)};
}

std::string shortened(const std::string& text) { return text.size() <= 80 ? text : text.substr(0, 77) + "..."; }

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = text.find_first_not_of(" \t", at)) != std::string::npos) {
    size_t end = text.find_first_of(" \t", at);
    out.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end;
  }
  return out;
}

}  // namespace

int serve(Package& package) {
  c10::InferenceMode inference;
  std::vector<at::Tensor> inputs;
  answer({{"ready", true}, {"device", package.device().str()}});
  std::string line;
  bool too_long;
  while (next_line(line, too_long)) {
    try {
      if (too_long) throw usage_error("a command longer than 64 KiB; send `inputs FILE.npz`, `time N WARMUP` or `quit`");
      auto [command, rest] = split(line);
      if (command.empty()) continue;  // a blank line asks nothing
      if (command == "inputs") {
        // The rest of the line is the path: a path with spaces stays one path.
        if (rest.empty()) throw usage_error("inputs needs a file: `inputs FILE.npz`");
        if (rest.find('\0') != std::string::npos) throw usage_error("the path after inputs holds a NUL byte; send the file's path");
        inputs.clear();  // a failed `inputs` leaves none: a later `time` must not time the previous ones
        std::vector<at::Tensor> read = read_inputs({rest}, package);
        for (auto& t : read) t = t.to(package.device());
        auto start = Clock::now();
        package.run(read);
        synchronize(package.device());
        double first_ms = ms_since(start);
        inputs = std::move(read);
        answer({{"first_call_ms", first_ms}, {"ran", package.model_for(inputs)}});
      } else if (command == "time") {
        std::vector<std::string> counts = words(rest);
        std::optional<int> count = counts.size() == 2 ? parse_calls(counts[0]) : std::nullopt;
        std::optional<int> warmup = counts.size() == 2 ? parse_calls(counts[1]) : std::nullopt;
        if (!count || !warmup) {
          throw usage_error("time takes two whole numbers, N and WARMUP, each 0 to " + std::to_string(kMaxCalls) + ", got '" +
                            shortened(rest) + "'; send e.g. `time 100 10`");
        }
        if (inputs.empty()) throw usage_error("send `inputs FILE.npz` before `time`");
        answer({{"samples_ms", time_calls(package, inputs, *count, *warmup)}});
      } else if (command == "quit") {
        return 0;
      } else {
        throw usage_error("unknown command '" + shortened(command) + "'; use inputs, time or quit");
      }
    } catch (const Error& err) {
      answer({{"error", err.what()}, {"exit_code", err.exit_code()}});
    } catch (const std::exception& exc) {
      // A failure inside torch or the compiled model: answered like any other, and the loop goes on.
      std::string what = exc.what();
      answer({{"error", "the package failed to run: " + what.substr(0, what.find('\n'))}, {"exit_code", 1}});
    }
  }
  return 0;
}

}  // namespace aotc::runner
