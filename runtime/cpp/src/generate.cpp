// aotc::Package::generate: the Python runtime's generation loop (aotc_runtime/generation.py) in C++:
// the prompts' prefill, then one decode step per new token over the KV cache the package keeps as
// its state. The program is one step over a cache in which each row has its own timeline
// (aotc/export/row_cache.py):
//
//   step(input_ids [B, S], cache_lengths [B], input_lengths [B]) -> logits [B, vocab]
//
// row b holding cache_lengths[b] tokens and fed the last input_lengths[b] tokens of its window.
//
// Messages and checks are the Python runtime's (check_request), so both refuse the same requests
// with the same line.
#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "aotc/package.h"
#include "cuda_graphs.h"

namespace aotc {
namespace {

std::string shape_list(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// The caller's end-of-sequence ids and sampling: ids the embedding has rows for, values the
// sampler turns into probabilities (never NaN).
void check_options(const Generation& g, const GenerateOptions& options) {
  for (int64_t id : options.eos_token_ids.value_or(std::vector<int64_t>{})) {
    if (id < 0 || id >= g.vocab_size) {
      throw usage_error("end-of-sequence id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(g.vocab_size - 1) +
                        ")");
    }
  }
  std::string problem = sampling_problem(options.sampling);
  if (!problem.empty()) throw usage_error(problem);
}

void check_request(const Generation& g, const at::Tensor& ids, const at::Tensor& mask, const GenerateOptions& options) {
  if (ids.dim() != 2 || (ids.scalar_type() != at::kLong && ids.scalar_type() != at::kInt)) {
    throw usage_error("input_ids must be a 2-D tensor of token ids [prompts, tokens], got " + dtype_name(ids.scalar_type()) +
                      shape_list(ids.sizes()));
  }
  int64_t prompts = ids.size(0), length = ids.size(1);
  if (prompts == 0 || length == 0) throw usage_error("the prompt is empty; give at least one token");
  if (prompts > g.batch_size) {
    throw usage_error(std::to_string(prompts) + " prompts, but the package generates for at most " + std::to_string(g.batch_size) +
                      " at once; split them, or export with a larger --batch-size");
  }
  if (mask.defined() && mask.sizes() != ids.sizes()) {
    throw usage_error("attention_mask is " + shape_list(mask.sizes()) + ", input_ids " + shape_list(ids.sizes()) +
                      "; give one mask entry per token");
  }
  if (mask.defined() && mask.sum(-1).eq(0).any().item<bool>()) throw usage_error("a prompt is empty (its attention mask is all 0)");
  int64_t low = ids.min().item<int64_t>(), high = ids.max().item<int64_t>();
  if (low < 0 || high >= g.vocab_size) {
    throw usage_error("token id " + std::to_string(low < 0 ? low : high) + " is outside the vocabulary (0.." +
                      std::to_string(g.vocab_size - 1) + ")");
  }
  int64_t wanted = options.max_new_tokens;
  if (wanted < 1) throw usage_error("max_new_tokens is " + std::to_string(wanted) + "; ask for at least 1");
  if (wanted > g.max_seq_len - length) {  // length + wanted could overflow
    int64_t room = g.max_seq_len - wanted;
    std::string fix = room >= 1 ? "shorten the prompt to at most " + std::to_string(room) + " tokens, ask for fewer new tokens,"
                                : "ask for at most " + std::to_string(g.max_seq_len - length) + " new tokens";
    throw usage_error("a prompt of " + std::to_string(length) + " tokens and " + std::to_string(wanted) + " new tokens need " +
                      std::to_string(length + wanted) + " positions, but the package's KV cache holds " +
                      std::to_string(g.max_seq_len) + "; " + fix + " or export with a larger --max-seq-len");
  }
  check_options(g, options);
}

// A step's new tokens on the host, copied while the device runs the next step: the copy is queued
// before the next replay (which overwrites them) and waited for after it (the Python runtime's
// HostCopy). CUDA only: a pinned buffer and an event on the current stream.
class HostCopy {
 public:
  HostCopy(int64_t n, at::Device device) : device_(device), done_(device.type()) {
    buffer_ = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  }
  void start(const at::Tensor& tokens) {
    buffer_.copy_(tokens, /*non_blocking=*/true);
    done_.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
  std::vector<int64_t> result(int64_t n) {
    done_.synchronize();
    return std::vector<int64_t>(buffer_.data_ptr<int64_t>(), buffer_.data_ptr<int64_t>() + n);
  }

 private:
  at::Device device_;
  c10::Event done_;
  at::Tensor buffer_;
};

}  // namespace

void Package::start_pick(const std::vector<int64_t>& eos, int64_t pad) {
  pick_.unfinished.fill_(true);
  pick_.eos.fill_(-1);  // never a token id
  // more ids than slots: the host picks (the graph's choice is overwritten before each replay)
  const auto n = static_cast<int64_t>(std::min(eos.size(), kEosSlots));
  if (n) pick_.eos.narrow(0, 0, n).copy_(at::tensor(eos, at::kLong).narrow(0, 0, n));
  pick_.pad.fill_(pad);
}

at::Tensor Package::pick_next(const at::Tensor& logits) {
  at::Tensor tokens = at::where(pick_.unfinished, logits.argmax(-1), pick_.pad);
  pick_.unfinished.logical_and_(tokens.unsqueeze(1).eq(pick_.eos).any(-1).logical_not());
  pick_.tokens.copy_(tokens);
  return pick_.tokens;
}

bool Package::start_decode_graph(const std::vector<at::Tensor>& first) {
  if (!decode_graph_) {
    decode_inputs_.clear();
    for (const auto& t : first) decode_inputs_.push_back(t.clone());
    // The warm-up runs the step on the first decode inputs: it writes the cache positions the first
    // replay writes, with the same values.
    auto program = [this] {
      std::vector<at::Tensor> flat = decode_inputs_;
      flat.insert(flat.end(), state_.begin(), state_.end());
      decode_logits_ = call_flat(flat, /*graphs=*/false)[0];
      return decode_logits_;
    };
    auto advance = [this] {  // the next step's inputs, on the device: no host value per token
      decode_inputs_[1].add_(decode_inputs_[2]);  // each row holds what it was fed
      // a greedy generation's next tokens, into the next step's ids; a sampled one writes its own
      // into them before each replay
      decode_inputs_[0].copy_(pick_next(decode_logits_).unsqueeze(1));
    };
    decode_graph_ = capture_step(program, advance, device_);
    if (!decode_graph_) {
      decode_graph_failed_ = true;  // this load decodes without graphs from now on
      return false;
    }
    return true;
  }
  for (size_t i = 0; i < first.size(); ++i) decode_inputs_[i].copy_(first[i]);
  return true;
}

std::vector<std::vector<int64_t>> Package::generate(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                    const GenerateOptions& options, const TokenCallback& on_tokens) {
  if (!manifest_.generation) {
    throw package_error("package " + folder_ +
                        " is not a text-generation package; export the model with `aotc export --task text-generation "
                        "--max-seq-len N` and build that");
  }
  const Generation& g = *manifest_.generation;
  check_request(g, input_ids, attention_mask, options);
  c10::InferenceMode inference;
  const int64_t prompts = input_ids.size(0), length = input_ids.size(1), batch = g.batch_size;
  const auto on = at::TensorOptions().dtype(at::kLong).device(device_);
  at::Tensor ids = input_ids.to(on);
  at::Tensor mask = attention_mask.defined() ? attention_mask.to(on) : at::ones_like(ids);
  if (prompts < batch) {  // the package's batch is fixed: the other rows are fed nothing
    at::Tensor filler = at::zeros({batch - prompts, length}, on);
    ids = at::cat({ids, filler});
    mask = at::cat({mask, filler});
  }
  std::vector<int64_t> eos_list = options.eos_token_ids ? *options.eos_token_ids : g.eos_token_ids;
  at::Tensor eos = at::tensor(eos_list, at::kLong).to(device_);
  int64_t pad = g.pad_token_id ? *g.pad_token_id : (eos_list.empty() ? 0 : eos_list[0]);  // transformers pads with eos then
  // each prompt's row draws from a generator of its own, seeded alike (the Python runtime's RowPicker)
  std::vector<at::Generator> generators = row_generators(options.sampling.greedy() ? 0 : prompts, options.sampling.seed, device_);

  reset_state();
  // prefill: each row's real tokens (mask 1), in order, at the end of its window; an empty cache
  // (the Python runtime's prefill_inputs)
  // std::optional spelled out: sort(true, 1) would pick the overload sort(dim, descending)
  at::Tensor order = std::get<1>(mask.sort(std::optional<bool>(true), /*dim=*/1, /*descending=*/false));
  at::Tensor window = ids.gather(1, order);
  at::Tensor held = at::zeros({batch}, on);
  at::Tensor fed = mask.sum(-1);
  // never through the CUDA-graph runner: it would capture one graph per prompt length
  at::Tensor logits = run_step({window, held, fed}, /*graphs=*/false)[0];
  // the first decode step's inputs: each prompt's row holds its prompt and is fed a token a step
  at::Tensor step_held = fed.clone();
  at::Tensor step_fed = at::arange(batch, on).lt(prompts).to(at::kLong);

  // On CUDA with CUDA graphs, each decode step is one replay, as in the Python runtime: a package
  // whose program updates its state in place replays on state_ itself. The graph is captured (or
  // readied) before the first token is out, so its capture is part of the time to first token.
  bool graphs = device_.is_cuda() && manifest_.cuda_graphs && manifest_.signature.state_in_place && !decode_graph_failed_ &&
                options.max_new_tokens > 1;
  // A greedy generation on the graph picks its tokens inside it (pick_); otherwise the host picks.
  bool in_graph = graphs && options.sampling.greedy() && eos_list.size() <= kEosSlots;
  at::Tensor unfinished = at::ones({batch}, on.dtype(at::kBool));
  at::Tensor tokens;
  if (graphs) {
    if (!pick_.tokens.defined() || pick_.tokens.size(0) != batch) {
      pick_ = {at::zeros({batch}, on), at::ones({batch}, on.dtype(at::kBool)), at::full({static_cast<int64_t>(kEosSlots)}, -1, on),
               at::zeros({}, on)};
    }
    start_pick(eos_list, pad);
  }
  if (in_graph) {
    tokens = pick_next(logits);  // the prefill's logits, picked the way the graph picks
  } else {
    tokens = next_tokens_per_row(logits, options.sampling, generators);
    tokens = at::where(unfinished, tokens, at::full_like(tokens, pad));
    if (eos.numel()) unfinished &= at::isin(tokens, eos).logical_not();
  }
  if (graphs) graphs = start_decode_graph({tokens.unsqueeze(1), step_held, step_fed});
  if (in_graph && !graphs) {  // capture failed: the host picks from here on
    in_graph = false;
    unfinished = pick_.unfinished.clone();
  }

  std::vector<std::vector<int64_t>> generated(prompts);
  auto emit = [&](const std::vector<int64_t>& row) {  // a step's tokens, to the result and the callback
    for (int64_t i = 0; i < prompts; ++i) generated[i].push_back(row[i]);
    if (on_tokens) on_tokens(row);
  };
  if (in_graph) {
    // Each step: the tokens' copy to the host queued, then the next replay (which picks the tokens
    // after these), then the wait for the copy: the device works while the host waits. A generation
    // ending at end-of-sequence has queued one step it does not use.
    HostCopy host(batch, device_);
    std::vector<bool> finished(prompts, false);
    for (int64_t step = 0; step < options.max_new_tokens; ++step) {
      const bool last = step + 1 == options.max_new_tokens;
      host.start(pick_.tokens);
      if (!last) decode_graph_->replay();
      std::vector<int64_t> row = host.result(batch);
      row.resize(prompts);
      emit(row);
      bool all_finished = !eos_list.empty();
      for (int64_t i = 0; i < prompts; ++i) {
        finished[i] = finished[i] || std::find(eos_list.begin(), eos_list.end(), row[i]) != eos_list.end();
        all_finished = all_finished && finished[i];
      }
      if (last || all_finished) break;
    }
    return generated;
  }
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (step > 0) {
      tokens = next_tokens_per_row(logits, options.sampling, generators);
      tokens = at::where(unfinished, tokens, at::full_like(tokens, pad));
      if (eos.numel()) unfinished &= at::isin(tokens, eos).logical_not();
    }
    at::Tensor host = tokens.to(at::kCPU).contiguous();
    std::vector<int64_t> row(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + prompts);
    emit(row);
    bool last = step + 1 == options.max_new_tokens;
    if (last || (eos.numel() && !unfinished.narrow(0, 0, prompts).any().item<bool>())) break;
    if (graphs) {
      if (step > 0) decode_inputs_[0].copy_(tokens.unsqueeze(1));
      logits = decode_graph_->replay();
      continue;
    }
    logits = run({tokens.unsqueeze(1), step_held, step_fed})[0];
    step_held += step_fed;
  }
  return generated;
}

}  // namespace aotc
