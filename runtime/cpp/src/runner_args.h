// aotc-runner's command line: the flags, read strictly (a value out of range, a fraction where a
// count goes, or flags that belong to another kind of run are refused, exit 2, one line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aotc/package.h"

namespace aotc::runner {

struct Args {
  std::string package, output, public_key;
  std::vector<std::string> inputs;
  int iters = 0, warmup = 3;
  int threads = 0;  // --threads; 0: the default rule (aotc/threads.h)
  uint64_t seed = 0;
  bool as_json = false;
  bool serve = false;
  bool require_signature = false;
  // --generate (a text-generation package): as `aotc generate`, token ids in and out
  bool generate = false, stream = false;
  std::vector<std::vector<int64_t>> prompts;
  GenerationRequest generation;
};

// The arguments, or aotc::Error (exit 2; --output not ending in .npz: exit 8); --help prints the
// usage and exits 0.
Args parse_args(int argc, char** argv);

}  // namespace aotc::runner
