// aotc::Package: a package folder written by `aotc build`, loaded and called from C++ with no
// Python. The same contract as the Python runtime (aotc_runtime.load): the manifest is checked,
// file hashes verified, the torch release / platform / GPU architecture compared, inputs checked
// against the signature before every call, state carried between calls, TF32 set around calls of
// a tf32 package, and a CUDA graph replayed per input signature for reduce-overhead packages;
// with LoadOptions::public_key, its signature checked first (aotc_runtime.load(public_key=...)).
// A package with `specializations` loads each member as a Package of its own and runs a call on
// the member whose dim values the inputs have, else on its dynamic model.
//
//   auto package = aotc::Package::load("model_pkg");
//   std::vector<at::Tensor> outputs = package.run({x});   // outputs in signature order
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

#include "aotc/error.h"
#include "aotc/manifest.h"
#include "aotc/sampling.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace aotc {

// Where a load's time went, in milliseconds (aotc-runner --json reports it).
// Where a load's time went. `device` (CUDA initialisation and the GPU check) runs on its own thread
// while `hashes` runs, so the load takes less than the sum.
struct LoadTimes {
  double manifest_ms = 0, device_ms = 0, hashes_ms = 0, loader_ms = 0, state_ms = 0;
};

struct LoadOptions {
  bool verify = true;            // check file hashes (skip only right after verifying them yourself)
  bool reuse_outputs = false;    // CUDA-graph packages: return the graph's own output buffers (no copy)
  LoadTimes* times = nullptr;    // filled in when given
  // An ed25519 public key (PEM, `aotc keygen`): when set, the package must be signed by its private
  // key (`aotc sign`) and unchanged since, or load throws (exit 7); file hashes are then always checked.
  std::string public_key;
  // Set by a package for its members whose constants live in its shared weights file
  // (manifest `shared_weights`): the package's tensors, and the member's folder in it.
  std::shared_ptr<const std::unordered_map<std::string, at::Tensor>> shared_weights;
  std::string shared_program;
};

class CudaGraphs;
class CapturedStep;

// What one generation asks (the Python runtime's GenerationRequest, aotc_runtime/
// generation_request.py, field for field; the prompts are generate()'s input_ids). A sequence ends
// at its first end-of-sequence id or its max_new_tokens-th token. Stop strings are text: the C++
// runner reads no tokenizer, so it takes none.
struct GenerationRequest {
  int64_t max_new_tokens = 16;
  Sampling sampling;
  std::optional<std::vector<int64_t>> eos_token_ids;  // unset: the package's own; each in [0, vocab_size)
};

// Each step's new tokens, one per prompt, as they come (aotc-runner --stream).
using TokenCallback = std::function<void(const std::vector<int64_t>&)>;

class Package {
 public:
  static Package load(const std::string& folder, const LoadOptions& options = {});
  ~Package();
  Package(Package&&) noexcept;
  Package& operator=(Package&&) noexcept;

  // One call: inputs in signature order (any device; moved to the package's); outputs in the
  // signature's order. Throws aotc::Error (exit 8) naming the input that does not fit.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);

  // Raise aotc::Error (exit 8) unless `inputs` fit the signature (count, dtype, rank, sizes, ranges).
  void check_inputs(const std::vector<at::Tensor>& inputs) const;

  // Which model a call with these inputs runs: "model.pt2" (the dynamic model), or the `package`
  // path of the specialized member whose dims they match ("specialized/B-8"); aotc-runner's `ran`.
  std::string model_for(const std::vector<at::Tensor>& inputs) const;

  // Seeded random inputs that fit the signature (dynamic dims at their example size).
  std::vector<at::Tensor> random_inputs(uint64_t seed = 0) const;

  // Text generation with a package from `aotc export --task text-generation`, as the Python
  // runtime's Package.generate: prompts [P, S] of token ids (P at most the package's batch), left
  // padded where `attention_mask` [P, S] is 0 (undefined: no padding); returns each prompt's new
  // tokens (after an end-of-sequence token, the pad token, as transformers pads). The KV cache is
  // the package's state (each generation starts its rows empty; nothing is reset). Bad requests
  // throw aotc::Error with exit 2, one line.
  std::vector<std::vector<int64_t>> generate(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                             const GenerationRequest& request, const TokenCallback& on_tokens = {});

  void reset_state();  // state that forward updates, back to its value at export
  const Manifest& manifest() const { return manifest_; }
  const std::string& folder() const { return folder_; }
  at::Device device() const { return device_; }
  size_t cuda_graphs_captured() const;

 private:
  // A specialized member that loaded (ONNX Runtime members are skipped) and the dims it runs.
  struct Member {
    std::map<std::string, int64_t> dims;
    std::string path;  // its `package`, relative to folder_
    std::unique_ptr<Package> package;
  };

  Package() = default;
  // graphs: through the CUDA-graph runner, where the package has one; else a plain call
  std::vector<at::Tensor> call_flat(const std::vector<at::Tensor>& flat, bool graphs = true);
  // run(), where `graphs` false never captures (generation's prefill: a capture per prompt length)
  std::vector<at::Tensor> run_step(const std::vector<at::Tensor>& inputs, bool graphs);
  // the decode step's CUDA graph for this sampler mode, captured at its first use and kept; false
  // where capture failed
  bool decode_graph_ready(SamplerMode mode);
  // one decode step on decode_inputs_ and state_ (a replay, or else a call): the next tokens in
  // sampler_.tokens and the ids buffer, the inputs advanced
  void decode_step(SamplerMode mode, bool graphs);
  // after a decode step's call (inside the graph when one replays): the fed rows' positions one
  // on, the sampler's choice from `logits` in the ids buffer
  void decode_advance(const at::Tensor& logits, SamplerMode mode);
  const Member* member_for(const std::vector<at::Tensor>& inputs) const;

  std::string folder_;
  Manifest manifest_;
  at::Device device_ = at::kCPU;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::vector<at::Tensor> initial_state_, state_;
  std::unique_ptr<CudaGraphs> graphs_;
  // generation's decode step as CUDA graphs, one per sampler mode, made at a CUDA package's first
  // generate that needs each (CUDA graphs on) and kept: its input buffers (the step format's
  // input_ids, rows, positions and picks, one token a row), the rows it feeds (1, else 0: a free
  // row, at position max_seq_len), the sampler whose buffers the graphs read, and the graphs. Each
  // replays the program on state_ (updated in place; reset_state() resets it in place), the
  // inputs' advance, and the sampler's choice of the next tokens, written into the ids buffer (the
  // Python runtime's DecodeGraph).
  std::vector<at::Tensor> decode_inputs_;
  at::Tensor decode_fed_;
  RowSampler sampler_;
  std::map<SamplerMode, std::unique_ptr<CapturedStep>> decode_graphs_;
  std::set<SamplerMode> decode_graph_failed_;
  std::vector<Member> members_;
  // the constants its programs read in place (user-managed): alive as long as they run
  std::shared_ptr<const std::unordered_map<std::string, at::Tensor>> shared_weights_;
};

// at::ScalarType of a signature dtype name ("float32" -> at::kFloat); throws for unknown names.
at::ScalarType scalar_type(const std::string& dtype);
std::string dtype_name(at::ScalarType type);

}  // namespace aotc
