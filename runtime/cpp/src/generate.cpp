// aotc::Package::generate: the Python runtime's generation loop (aotc_runtime/generation.py) in C++,
// for prompts that all start together: one prefill step in which every prompt's row joins at once
// (the Python runtime's engine joins rows as they come, a chunk of a prompt a step), then one
// decode step per new token over the KV cache the package keeps as its state. The program is one
// step over packed tokens, each row of the cache with its own timeline (aotc/export/row_cache.py,
// step format 4):
//
//   step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]
//
// token t written to row rows[t] at position positions[t] and attending to that row's positions
// 0..positions[t]; a position of max_seq_len feeds no row (the cache's padding slot); logits[r] are
// token picks[r]'s.
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
void check_options(const Generation& g, const GenerationRequest& request) {
  for (int64_t id : request.eos_token_ids.value_or(std::vector<int64_t>{})) {
    if (id < 0 || id >= g.vocab_size) {
      throw usage_error("end-of-sequence id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(g.vocab_size - 1) +
                        ")");
    }
  }
  std::string problem = sampling_problem(request.sampling);
  if (!problem.empty()) throw usage_error(problem);
}

void check_request(const Generation& g, const at::Tensor& ids, const at::Tensor& mask, const GenerationRequest& request) {
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
  int64_t wanted = request.max_new_tokens;
  if (wanted < 1) throw usage_error("max_new_tokens is " + std::to_string(wanted) + "; ask for at least 1");
  if (wanted > g.max_seq_len - length) {  // length + wanted could overflow
    int64_t room = g.max_seq_len - wanted;
    std::string fix = room >= 1 ? "shorten the prompt to at most " + std::to_string(room) + " tokens, ask for fewer new tokens,"
                                : "ask for at most " + std::to_string(g.max_seq_len - length) + " new tokens";
    throw usage_error("a prompt of " + std::to_string(length) + " tokens and " + std::to_string(wanted) + " new tokens need " +
                      std::to_string(length + wanted) + " positions, but the package's KV cache holds " +
                      std::to_string(g.max_seq_len) + "; " + fix + " or export with a larger --max-seq-len");
  }
  check_options(g, request);
}

// A step's new tokens on the host, copied while the device runs the next step: the copy is queued
// before the next replay (which overwrites them) and waited for after it (the Python runtime's
// HostCopy). CUDA only: a pinned buffer and an event on the current stream.
class HostCopy {
 public:
  HostCopy(int64_t n, at::Device device) : device_(device), done_(device.type()) {
    buffer_ = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    failed_ = at::empty({n}, at::TensorOptions().dtype(at::kBool).pinned_memory(true));
  }
  // the tokens, and the rows whose logits were not finite (RowSampler::failed)
  void start(const at::Tensor& tokens, const at::Tensor& failed) {
    buffer_.copy_(tokens, /*non_blocking=*/true);
    failed_.copy_(failed, /*non_blocking=*/true);
    done_.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
  std::vector<int64_t> result(int64_t n) {
    done_.synchronize();
    return std::vector<int64_t>(buffer_.data_ptr<int64_t>(), buffer_.data_ptr<int64_t>() + n);
  }
  const at::Tensor& failed() const { return failed_; }  // after result()

 private:
  at::Device device_;
  c10::Event done_;
  at::Tensor buffer_, failed_;
};

// The prefill step: every prompt's real tokens (mask not 0), in order, packed one prompt after the
// other, prompt b's fed to row b at positions 0.. . Each row's cache starts empty with nothing
// reset: a token reads only its row's positions up to its own, all written in this step, so what
// an earlier generation left there is never read. Built on the host, where the prompts are: a
// prefill is one step, not one a token.
struct Prefill {
  std::vector<at::Tensor> inputs;  // input_ids, rows, positions, picks
  std::vector<int64_t> lengths;    // each prompt's tokens: the positions its row holds after the step
};

// `picks`: the logits wanted, one per prompt (its last token's), then 0s up to `picks` (those
// logits are not read).
Prefill packed_prompts(const at::Tensor& input_ids, const at::Tensor& attention_mask, int64_t picks, at::Device device) {
  at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  at::Tensor mask = attention_mask.defined() ? attention_mask.to(at::kCPU, at::kLong).contiguous() : at::ones_like(ids);
  const int64_t prompts = ids.size(0), length = ids.size(1);
  std::vector<int64_t> tokens, rows, positions, picked;
  Prefill prefill;
  for (int64_t b = 0; b < prompts; ++b) {
    const int64_t *id = ids[b].data_ptr<int64_t>(), *real = mask[b].data_ptr<int64_t>();
    int64_t held = 0;
    for (int64_t i = 0; i < length; ++i) {
      if (real[i] == 0) continue;
      tokens.push_back(id[i]);
      rows.push_back(b);
      positions.push_back(held++);
    }
    picked.push_back(static_cast<int64_t>(tokens.size()) - 1);
    prefill.lengths.push_back(held);
  }
  picked.resize(picks, 0);
  const auto on = at::TensorOptions().dtype(at::kLong);
  for (const auto* values : {&tokens, &rows, &positions, &picked}) prefill.inputs.push_back(at::tensor(*values, on).to(device));
  return prefill;
}

}  // namespace

// The next decode step's inputs, on the device: no host value per token. A fed row holds one more
// position; a free row stays at max_seq_len, fed nothing. The sampler writes the ids buffer.
void Package::decode_advance(const at::Tensor& logits, SamplerMode mode) {
  decode_inputs_[2].add_(decode_fed_);
  decode_inputs_[0].copy_(sampler_(logits, decode_fed_, mode));
}

bool Package::decode_graph_ready(SamplerMode mode) {
  if (decode_graphs_.count(mode)) return true;
  if (decode_graph_failed_.count(mode)) return false;
  // The warm-up runs the program on the decode inputs: it writes the cache positions the first
  // replay writes, with the same values. The sampler's draw counts advance only inside the graph.
  at::Tensor logits;
  auto program = [this, &logits] {
    std::vector<at::Tensor> flat = decode_inputs_;
    flat.insert(flat.end(), state_.begin(), state_.end());
    logits = call_flat(flat, /*graphs=*/false)[0];
    return logits;
  };
  auto graph = capture_step(program, [this, &logits, mode] { decode_advance(logits, mode); }, device_);
  if (!graph) {
    decode_graph_failed_.insert(mode);  // this mode decodes without graphs from now on
    return false;
  }
  decode_graphs_[mode] = std::move(graph);
  return true;
}

void Package::decode_step(SamplerMode mode, bool graphs) {
  if (graphs && decode_graph_ready(mode)) {
    decode_graphs_[mode]->replay();
    return;
  }
  decode_advance(run_step(decode_inputs_, /*graphs=*/false)[0], mode);
}

std::vector<std::vector<int64_t>> Package::generate(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                    const GenerationRequest& request, const TokenCallback& on_tokens) {
  if (!manifest_.generation) {
    throw package_error("package " + folder_ +
                        " is not a text-generation package; export the model with `aotc export --task text-generation "
                        "--max-seq-len N` and build that");
  }
  const Generation& g = *manifest_.generation;
  check_request(g, input_ids, attention_mask, request);
  c10::InferenceMode inference;
  const int64_t prompts = input_ids.size(0);
  const bool graphs = device_.is_cuda() && manifest_.cuda_graphs && manifest_.signature.state_in_place;
  // A step whose logits are R tokens' (a dim) is fed the prompts' rows only, unless a CUDA graph
  // replays it (captured once, for the whole batch): a free row would cost a row's step.
  const bool fewer_rows = !manifest_.signature.inputs[3].shape[0].is_static() && !graphs;
  const int64_t batch = fewer_rows ? prompts : g.batch_size;
  const auto on = at::TensorOptions().dtype(at::kLong).device(device_);
  const std::vector<int64_t> eos = request.eos_token_ids ? *request.eos_token_ids : g.eos_token_ids;
  const int64_t pad = g.pad_token_id ? *g.pad_token_id : (eos.empty() ? 0 : eos[0]);  // transformers pads with eos then

  // The Python runtime's decode engine, for prompts that all join at the first step: one sampler
  // row per prompt (each draws its own numbers: a prompt's tokens are the same alone or beside
  // others), the other rows greedy and fed nothing. A decode step feeds row b its last token and
  // picks its logits: rows and picks are 0..batch-1 for good.
  if (!sampler_.defined() || decode_inputs_[0].size(0) != batch) {  // rows in use change only without graphs
    sampler_ = RowSampler(batch, g.vocab_size, device_);
    decode_inputs_ = {at::zeros({batch}, on), at::arange(batch, on), at::zeros({batch}, on), at::arange(batch, on)};
    decode_fed_ = at::zeros({batch}, on);
  }
  for (int64_t row = 0; row < batch; ++row) sampler_.set(row, row < prompts ? request.sampling : Sampling{});
  const SamplerMode mode = sampler_.mode();
  at::Tensor prompt_rows = at::arange(batch, on).lt(prompts);

  // prefill: all prompts in one step, the logits of each one's last token (as many picks as the
  // sampler has rows). Never through the CUDA-graph runner: it would capture one graph per count
  // of prompt tokens.
  Prefill prefill = packed_prompts(input_ids, attention_mask, batch, device_);
  at::Tensor logits = run_step(prefill.inputs, /*graphs=*/false)[0];
  at::Tensor tokens = sampler_(logits, prompt_rows, mode);
  // the first decode step: each prompt's row holds its prompt and is fed a token a step; a free
  // row is fed at max_seq_len, which writes the padding slot and reads nothing
  std::vector<int64_t> held(batch, g.max_seq_len);
  std::copy(prefill.lengths.begin(), prefill.lengths.end(), held.begin());
  decode_inputs_[0].copy_(tokens);
  decode_inputs_[2].copy_(at::tensor(held, at::kLong));
  decode_fed_.copy_(prompt_rows.to(at::kLong));

  // On CUDA with CUDA graphs, each decode step is one replay, as in the Python runtime: the
  // program on state_ (in place), the inputs' advance, and the sampler's choice. A step's tokens are
  // copied to the host while the device runs the next step; elsewhere they are read, then the next
  // step runs.
  const bool overlap = device_.is_cuda();
  std::unique_ptr<HostCopy> host;
  if (overlap) host = std::make_unique<HostCopy>(batch, device_);
  std::vector<std::vector<int64_t>> generated(prompts);
  std::vector<bool> finished(prompts, false);
  for (int64_t step = 0; step < request.max_new_tokens; ++step) {
    const bool last = step + 1 == request.max_new_tokens;
    std::vector<int64_t> row;
    at::Tensor failed;  // on the host: this step's rows whose logits were not finite
    if (overlap) {
      host->start(sampler_.tokens, sampler_.failed);  // copied before the step queued ahead rewrites them
      if (!last) decode_step(mode, graphs);  // a generation ending at end-of-sequence queued one step it does not use
      row = host->result(batch);
      failed = host->failed();
    } else {
      at::Tensor on_host = sampler_.tokens.to(at::kCPU).contiguous();
      row.assign(on_host.data_ptr<int64_t>(), on_host.data_ptr<int64_t>() + batch);
      failed = sampler_.failed.to(at::kCPU).contiguous();
    }
    row.resize(prompts);
    for (int64_t i = 0; i < prompts; ++i) {
      if (!finished[i] && failed.data_ptr<bool>()[i]) {
        throw model_error("the package's logits for prompt " + std::to_string(i) +
                          " were not finite (NaN or infinite) at its token " + std::to_string(step + 1) +
                          ": its weights, its dtype's range or its inputs; check the package with `aotc verify`, "
                          "or build it in float32");
      }
    }
    bool all_finished = true;
    for (int64_t i = 0; i < prompts; ++i) {
      if (finished[i]) {
        row[i] = pad;  // a sequence that ended shows the pad token (transformers' padding)
      } else {
        finished[i] = std::find(eos.begin(), eos.end(), row[i]) != eos.end();
      }
      all_finished = all_finished && finished[i];
    }
    for (int64_t i = 0; i < prompts; ++i) generated[i].push_back(row[i]);
    if (on_tokens) on_tokens(row);
    if (last || all_finished) break;
    if (!overlap) decode_step(mode, graphs);
  }
  return generated;
}

}  // namespace aotc
