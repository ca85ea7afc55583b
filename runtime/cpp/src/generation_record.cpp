// check_generation: a text-generation package's `generation` record against its signature, at load,
// before anything is allocated from the record (Package::generate sizes its mask and batch from it).
// The checks, their order and messages are aotc_runtime/generation_record.py's; the signature is the
// compiled model's own (check_contract ran first), so a record that disagrees with it was edited.
// The step's shapes (aotc/export/text_generation.py):
//
//   step(input_ids [B, S], position_ids [B, S], cache_position [S], attention_mask [B, max_len])
//       -> logits [B, vocab]; state key_cache_i / value_cache_i [B, heads, max_len, head dim]
#include <algorithm>
#include <array>
#include <string>

#include "aotc/error.h"
#include "aotc/manifest.h"

namespace aotc {
namespace {

// The step's inputs, in the order Package::generate passes them.
constexpr std::array<const char*, 4> kStepInputs = {"input_ids", "position_ids", "cache_position", "attention_mask"};

std::string entry_text(const ShapeEntry& entry) { return entry.is_static() ? std::to_string(entry.size) : entry.name; }

const TensorSpec* find(const std::vector<TensorSpec>& specs, const std::string& name) {
  auto found = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  return found == specs.end() ? nullptr : &*found;
}

// The step's form: its inputs by name, one output, 2-D ids, mask and logits ("" when it has it).
std::string form_problem(const Signature& sig) {
  std::string missing;
  for (const char* name : kStepInputs)
    if (!find(sig.inputs, name)) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty()) return "the model is not one generation step (it lacks " + missing + ")";
  if (sig.outputs.size() != 1) {
    return "the model has " + std::to_string(sig.outputs.size()) + " outputs, a generation step has 1 (logits)";
  }
  if (find(sig.inputs, "input_ids")->shape.size() != 2 || find(sig.inputs, "attention_mask")->shape.size() != 2 ||
      sig.outputs[0].shape.size() != 2) {
    return "input_ids, attention_mask and the logits are not 2-D";
  }
  for (size_t i = 0; i < kStepInputs.size(); ++i) {  // Package::generate passes them by position
    if (sig.inputs[i].name != kStepInputs[i]) {
      return "its inputs are not in a generation step's order (input_ids, position_ids, cache_position, attention_mask)";
    }
  }
  return "";
}

// The record's numbers against the model's sizes, then its ids against its vocabulary.
std::string size_problem(const Generation& g, const Signature& sig) {
  const TensorSpec &ids = *find(sig.inputs, "input_ids"), &mask = *find(sig.inputs, "attention_mask"), &logits = sig.outputs[0];
  const struct {
    const char* what;
    const ShapeEntry& size;
    int64_t expected;
  } sizes[] = {{"batch_size", ids.shape[0], g.batch_size},    {"batch_size", mask.shape[0], g.batch_size},
               {"batch_size", logits.shape[0], g.batch_size}, {"max_seq_len", mask.shape[1], g.max_seq_len},
               {"vocab_size", logits.shape[1], g.vocab_size}};
  for (const auto& s : sizes) {
    if (!s.size.is_static() || s.size.size != s.expected) {
      return std::string(s.what) + " is " + std::to_string(s.expected) + " but the model's is " + entry_text(s.size);
    }
  }
  if (ids.value_range && ids.value_range->second != g.vocab_size - 1) {
    return "vocab_size is " + std::to_string(g.vocab_size) + " but the model's token ids go up to " +
           std::to_string(ids.value_range->second);
  }
  // the KV cache the program writes: [B, heads, max_len, head dim] (the Python runtime's clone
  // of the state would allocate it; here it is checked like the inputs)
  for (const auto& spec : sig.state) {
    bool cache = spec.shape.size() == 4 && (spec.name.rfind("key_cache_", 0) == 0 || spec.name.rfind("value_cache_", 0) == 0);
    if (cache && spec.shape[0].size != g.batch_size) {
      return "batch_size is " + std::to_string(g.batch_size) + " but the model's is " + entry_text(spec.shape[0]);
    }
    if (cache && spec.shape[2].size != g.max_seq_len) {
      return "max_seq_len is " + std::to_string(g.max_seq_len) + " but the model's is " + entry_text(spec.shape[2]);
    }
  }
  return "";
}

std::string id_problem(const Generation& g, const Manifest& manifest) {
  std::vector<std::pair<std::string, int64_t>> named;
  if (g.pad_token_id) named.emplace_back("pad_token_id", *g.pad_token_id);
  for (int64_t id : g.eos_token_ids) named.emplace_back("eos_token_ids", id);
  for (const auto& [what, id] : named) {
    if (id < 0 || id >= g.vocab_size) {
      return what + " holds " + std::to_string(id) + ", outside the vocabulary (0.." + std::to_string(g.vocab_size - 1) + ")";
    }
  }
  if (g.sliding_window && *g.sliding_window < 0) return "sliding_window is " + std::to_string(*g.sliding_window) + ", below 0";
  // a tokenizer the hashes do not cover could be anything the folder happens to hold
  bool hashed = std::any_of(manifest.files.begin(), manifest.files.end(), [&](const auto& f) { return f.first == g.tokenizer; });
  if (!g.tokenizer.empty() && !hashed) return "its tokenizer " + g.tokenizer + " is not one of the package's hashed files";
  return "";
}

}  // namespace

void check_generation(const std::string& folder, const Manifest& manifest) {
  if (!manifest.generation) return;
  const Generation& g = *manifest.generation;
  std::string problem = form_problem(manifest.signature);
  if (problem.empty()) problem = size_problem(g, manifest.signature);
  if (problem.empty()) problem = id_problem(g, manifest);
  if (!problem.empty()) {
    throw package_error("package " + folder + ": its generation record does not match its compiled model: " + problem +
                        "; rebuild it with `aotc build --force`");
  }
}

}  // namespace aotc
