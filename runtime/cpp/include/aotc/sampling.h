// How the next token is picked (aotc_runtime/sampling.py in C++): greedy, or sampled after
// temperature, then top-k, then top-p (transformers' order), and the one set of accepted values
// that the Python API, `aotc generate`, HTTP and aotc-runner share (docs/reliability.md).
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace aotc {

// The accepted ranges: the constants of runtime/aotc_runtime/sampling.py, kept equal to them. Below
// kMinTemperature, logits / temperature overflows float32 and softmax gives NaN; below kMinTopP the
// nucleus is one token anyway, and float32 cannot tell the bound from 0.
inline constexpr double kMinTemperature = 0.01, kMaxTemperature = 100.0;
inline constexpr double kMinTopP = 1e-6;
inline constexpr int64_t kMaxTopK = std::numeric_limits<int32_t>::max();  // 2**31 - 1
// a seed is any uint64_t: 0 to 2**64 - 1, a generator's 64 bits

// Greedy (temperature 0, or top_k 1), or sampled from a generator seeded with `seed`.
struct Sampling {
  double temperature = 0.0;
  int64_t top_k = 0;   // 0: no top-k
  double top_p = 1.0;  // 1: no top-p
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

// Why these settings are outside the accepted values, in one line naming the value and the range
// (the Python runtime's Sampling.check); "" when they are accepted.
std::string sampling_problem(const Sampling& sampling);

// The next token of each sequence from [B, vocab] logits, on the logits' device.
at::Tensor next_tokens(const at::Tensor& logits, const Sampling& sampling, at::Generator& generator);

// The next token of every row: rows 0..generators.size()-1 sampled by `sampling`, each from its own
// generator (a prompt's tokens are then the same alone or beside others), the rest greedy
// (aotc_runtime/sampling.py's RowPicker).
at::Tensor next_tokens_per_row(const at::Tensor& logits, const Sampling& sampling, std::vector<at::Generator>& generators);

// One generator per sampled row, each seeded with `seed`, on `device` (CPU or CUDA).
std::vector<at::Generator> row_generators(int64_t rows, uint64_t seed, const at::Device& device);

}  // namespace aotc
