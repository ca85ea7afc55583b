// The sampler: aotc_runtime/sampling.py's Sampling.check, with its messages, and its RowSampler.
#include "aotc/sampling.h"

#include <ATen/ATen.h>

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

namespace {

// splitmix64's constants as the int64 that holds each 64-bit pattern (Steele, Lea and Flood, 2014)
constexpr int64_t kGolden = static_cast<int64_t>(0x9E3779B97F4A7C15ULL);
constexpr int64_t kMix1 = static_cast<int64_t>(0xBF58476D1CE4E5B9ULL);
constexpr int64_t kMix2 = static_cast<int64_t>(0x94D049BB133111EBULL);

// A logical shift of int64 lanes (torch shifts signed integers arithmetically).
at::Tensor shift_right(const at::Tensor& x, int64_t bits) { return x.bitwise_right_shift(bits).bitwise_and((int64_t{1} << (64 - bits)) - 1); }

}  // namespace

at::Tensor uniforms(const at::Tensor& seeds, const at::Tensor& counters) {
  at::Tensor z = seeds + (counters + 1) * kGolden;
  z = z.bitwise_xor(shift_right(z, 30)) * kMix1;
  z = z.bitwise_xor(shift_right(z, 27)) * kMix2;
  z = z.bitwise_xor(shift_right(z, 31));
  return shift_right(z, 40).to(at::kFloat) * std::ldexp(1.0, -24);
}

RowSampler::RowSampler(int64_t rows, int64_t vocab, at::Device device) : vocab_(vocab), settings_(rows) {
  const auto on = at::TensorOptions().device(device);
  greedy_ = at::ones({rows}, on.dtype(at::kBool));
  temperature_ = at::ones({rows}, on.dtype(at::kFloat));  // 1 where greedy: no inf
  top_k_ = at::full({rows}, vocab, on.dtype(at::kLong));
  top_p_ = at::ones({rows}, on.dtype(at::kFloat));
  seed_ = at::zeros({rows}, on.dtype(at::kLong));
  drawn_ = at::zeros({rows}, on.dtype(at::kLong));
  tokens = at::zeros({rows}, on.dtype(at::kLong));
  failed = at::zeros({rows}, on.dtype(at::kBool));
  positions_ = at::arange(vocab, on.dtype(at::kLong));
}

void RowSampler::set(int64_t row, const Sampling& s) {
  settings_[static_cast<size_t>(row)] = s;
  const bool greedy = s.greedy();
  greedy_[row].fill_(greedy);
  temperature_[row].fill_(greedy ? 1.0 : s.temperature);
  top_k_[row].fill_(greedy || s.top_k == 0 ? vocab_ : std::min(s.top_k, vocab_));
  top_p_[row].fill_(greedy ? 1.0 : s.top_p);
  seed_[row].fill_(static_cast<int64_t>(s.seed));  // the seed's 64 bits
  drawn_[row].fill_(0);
}

SamplerMode RowSampler::mode() const {
  SamplerMode mode = SamplerMode::kGreedyOnly;
  for (const Sampling& s : settings_) {
    if (s.greedy()) continue;
    if ((s.top_k > 0 && s.top_k < vocab_) || s.top_p < 1.0) return SamplerMode::kFiltered;
    mode = SamplerMode::kSampled;
  }
  return mode;
}

// The least logits a part of a row holds in largest()'s first stage (sampling.py's MIN_PART)
constexpr int64_t kMinPart = 1024;

// How many equal parts largest() splits a row of `vocab` logits into: the most that divide it
// evenly and leave each at least kMinPart; 1 when none does (sampling.py's parts_of).
static int64_t parts_of(int64_t vocab) {
  for (int64_t n = vocab / kMinPart; n > 1; --n) {
    if (vocab % n == 0) return n;
  }
  return 1;
}

// Each row's largest logit and its first id, a NaN counting as largest (as max over a dim); on CUDA
// in two stages, the largest of each part of the row, then of the parts, so one row's search
// spreads over the device at batch 1; on the CPU one reduction is faster (sampling.py's largest).
static std::tuple<at::Tensor, at::Tensor> largest(const at::Tensor& logits) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const int64_t parts = logits.is_cuda() ? parts_of(vocab) : 1;
  if (parts == 1) return logits.max(-1);
  const int64_t span = vocab / parts;
  auto [part_values, part_ids] = logits.reshape({rows, parts, span}).max(-1);
  auto [values, part] = part_values.max(-1);
  at::Tensor ids = part * span + part_ids.gather(1, part.unsqueeze(1)).squeeze(1);
  return {values, ids};
}

at::Tensor RowSampler::operator()(const at::Tensor& logits, const at::Tensor& drawing, SamplerMode mode) {
  auto [chosen, bad] = choose(logits, mode);
  failed.copy_(bad);
  if (drawing.defined()) {
    drawn_.add_(drawing.to(at::kLong));
  } else {
    drawn_.add_(1);
  }
  tokens.copy_(chosen);
  return tokens;
}

std::tuple<at::Tensor, at::Tensor> RowSampler::choose(const at::Tensor& logits, SamplerMode mode) const {
  // one search for the greedy pick and the rows whose largest logit is not finite (a NaN or +inf
  // among them, or nothing but -inf); such a row's token is 0
  auto [values, ids] = largest(logits);
  const at::Tensor bad = values.isfinite().logical_not();
  at::Tensor argmax = ids.masked_fill(bad, 0);
  if (mode == SamplerMode::kGreedyOnly) return {argmax, bad};
  at::Tensor scores = logits.to(at::kFloat) / temperature_.unsqueeze(1);
  if (mode == SamplerMode::kFiltered) scores = filtered(scores);
  at::Tensor running = scores.softmax(-1).cumsum(-1);
  at::Tensor total = running.narrow(-1, vocab_ - 1, 1);
  // below the total, which rounding of the product could reach: the first running sum above the
  // target then belongs to a token with some probability
  at::Tensor below = at::nextafter(total, at::zeros_like(total));
  at::Tensor target = at::minimum(uniforms(seed_, drawn_).unsqueeze(1) * total, below);
  at::Tensor picked = at::searchsorted(running, target, /*out_int32=*/false, /*right=*/true).squeeze(1);
  // inside the vocabulary whatever the sums hold (NaN sums search to the end)
  picked = picked.clamp_max(vocab_ - 1).masked_fill(bad, 0);
  return {at::where(greedy_, argmax, picked), bad};
}

at::Tensor RowSampler::filtered(const at::Tensor& scores) const {
  const double minus_inf = -std::numeric_limits<double>::infinity();
  at::Tensor ordered = std::get<0>(scores.sort(-1, /*descending=*/true));
  at::Tensor inside_k = positions_.lt(top_k_.unsqueeze(1));
  ordered = ordered.masked_fill(inside_k.logical_not(), minus_inf);
  at::Tensor probabilities = ordered.softmax(-1);
  // drop a token once the ones before it already hold top_p; the first always stays, and a row
  // without top-p drops nothing
  at::Tensor drop = (probabilities.cumsum(-1) - probabilities).ge(top_p_.unsqueeze(1));
  drop.logical_and_(top_p_.unsqueeze(1).lt(1));
  drop.select(-1, 0).fill_(false);
  at::Tensor kept = inside_k.logical_and(drop.logical_not()).sum(-1, /*keepdim=*/true);
  at::Tensor threshold = ordered.gather(1, kept - 1);
  return scores.masked_fill(scores.lt(threshold), minus_inf);
}

}  // namespace aotc
