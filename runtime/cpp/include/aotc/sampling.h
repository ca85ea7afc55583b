// How the next token is picked (aotc_runtime/sampling.py in C++): greedy, or sampled after
// temperature, then top-k, then top-p (transformers' order), and the one set of accepted values
// that the Python API, `aotc generate`, HTTP and aotc-runner share (docs/reliability.md).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
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

// One number in [0, 1) per row: splitmix64 of (seed, counter), its top 24 bits (the Python
// runtime's sampling.uniforms, the same operations on int64 tensors).
at::Tensor uniforms(const at::Tensor& seeds, const at::Tensor& counters);

// The least work a batch's settings need: argmax; softmax and a running sum; or a sort too.
enum class SamplerMode { kGreedyOnly, kSampled, kFiltered };

// The next token of every row from [B, vocab] logits, on the device, each row by its own Sampling
// (aotc_runtime/sampling.py's RowSampler, operation for operation, so both runtimes give a seeded
// row the same tokens): row b's i-th token draws the number uniforms(seed_b, i), inverse-CDF.
class RowSampler {
 public:
  RowSampler() = default;
  RowSampler(int64_t rows, int64_t vocab, at::Device device);
  bool defined() const { return tokens.defined(); }
  int64_t rows() const { return static_cast<int64_t>(settings_.size()); }

  // Row `row` picks by `sampling` from its next token on, its count of draws from 0.
  void set(int64_t row, const Sampling& sampling);
  SamplerMode mode() const;

  // The tokens into `tokens` (returned); `drawing` [B] marks the rows whose token counts
  // (undefined: every row).
  at::Tensor operator()(const at::Tensor& logits, const at::Tensor& drawing, SamplerMode mode);
  // (tokens, failed) without changing anything: failed marks the rows whose logits are not finite
  std::tuple<at::Tensor, at::Tensor> choose(const at::Tensor& logits, SamplerMode mode) const;

  at::Tensor tokens;  // [B] int64, the last call's choice
  // [B] bool: the last call's rows whose logits were not finite (NaN, +inf, or all -inf); their
  // token is 0, not a pick, and every token is inside the vocabulary (sampling.py's non_finite)
  at::Tensor failed;

 private:
  at::Tensor filtered(const at::Tensor& scores) const;
  int64_t vocab_ = 0;
  std::vector<Sampling> settings_;
  at::Tensor greedy_, temperature_, top_k_, top_p_, seed_, drawn_, positions_;
};

}  // namespace aotc
