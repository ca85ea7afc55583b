// The sampler: aotc_runtime/sampling.py's Sampling.check and next_tokens, with its messages.
#include "aotc/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace aotc {
namespace {

// The shortest text that reads back as `value`, as Python's repr writes a float ("1e-39", "0.5").
std::string number_text(double value) {
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

}  // namespace

std::string sampling_problem(const Sampling& s) {
  const double t = s.temperature;
  if (!(t == 0.0 || (t >= kMinTemperature && t <= kMaxTemperature))) {  // NaN fails both
    return "temperature " + number_text(t) + " is outside the accepted values: 0 for greedy, or " + number_text(kMinTemperature) +
           " to " + number_text(kMaxTemperature) + " to sample";
  }
  if (s.top_k < 0 || s.top_k > kMaxTopK) {  // 0 is "no top-k" here (Python's None)
    return "top-k " + std::to_string(s.top_k) + " is not a whole number from 1 to " + std::to_string(kMaxTopK);
  }
  if (!(s.top_p >= kMinTopP && s.top_p <= 1.0)) {
    return "top-p " + number_text(s.top_p) + " is outside [" + number_text(kMinTopP) + ", 1]";
  }
  return "";
}

at::Tensor next_tokens(const at::Tensor& logits, const Sampling& s, at::Generator& generator) {
  if (s.greedy()) return logits.argmax(-1);
  at::Tensor scores = logits.to(at::kFloat) / s.temperature;
  const double minus_inf = -std::numeric_limits<double>::infinity();
  if (s.top_k > 0 && s.top_k < scores.size(-1)) {
    at::Tensor kth = std::get<0>(at::topk(scores, s.top_k, -1)).narrow(-1, s.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, minus_inf);
  }
  if (s.top_p < 1.0) {
    auto [ordered, order] = at::sort(scores, -1, /*descending=*/true);
    at::Tensor probabilities = ordered.softmax(-1);
    // drop a token once the ones before it already hold top_p; the first always stays, even where
    // top_p rounds to 0 in float32
    at::Tensor drop = (probabilities.cumsum(-1) - probabilities) >= s.top_p;
    drop.select(-1, 0).fill_(false);
    scores = scores.scatter(-1, order, ordered.masked_fill(drop, minus_inf));
  }
  return at::multinomial(scores.softmax(-1), 1, false, generator).squeeze(-1);
}

at::Tensor next_tokens_per_row(const at::Tensor& logits, const Sampling& sampling, std::vector<at::Generator>& generators) {
  at::Tensor tokens = logits.argmax(-1);
  if (sampling.greedy()) return tokens;
  for (size_t row = 0; row < generators.size(); ++row) {
    const auto r = static_cast<int64_t>(row);
    tokens.narrow(0, r, 1).copy_(next_tokens(logits.narrow(0, r, 1), sampling, generators[row]));
  }
  return tokens;
}

std::vector<at::Generator> row_generators(int64_t rows, uint64_t seed, const at::Device& device) {
  std::vector<at::Generator> generators;
  for (int64_t row = 0; row < rows; ++row) {
    at::Generator generator = device.is_cuda() ? at::globalContext().defaultGenerator(device).clone()
                                               : at::make_generator<at::CPUGeneratorImpl>(seed);
    if (device.is_cuda()) generator.set_current_seed(seed);
    generators.push_back(generator);
  }
  return generators;
}

}  // namespace aotc
