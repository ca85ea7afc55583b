// check_generation: a text-generation package's `generation` record against its signature, at load,
// before anything is allocated from the record (Package::generate sizes its mask and batch from it).
// The checks, their order and messages are aotc_runtime/generation_record.py's; the signature is the
// compiled model's own (check_contract ran first), so a record that disagrees with it was edited.
// The step's shapes (aotc/export/row_cache.py), `step_format` 3:
//
//   step(input_ids [R, S], cache_lengths [R], input_lengths [R]) -> logits [R, vocab];
//   state key_cache_i / value_cache_i [B, max_len + 1, kv heads, head dim]
//
// R is B, or a dim from 1 to B (the step runs for the cache's first R rows); in format 2 it is B.
// A package of another step format (or none: from before aotc owned the cache) is refused first.
#include <algorithm>
#include <array>
#include <string>

#include "aotc/error.h"
#include "aotc/manifest.h"

namespace aotc {
namespace {

// The step's inputs, in the order Package::generate passes them.
constexpr std::array<const char*, 3> kStepInputs = {"input_ids", "cache_lengths", "input_lengths"};
constexpr std::array<int64_t, 2> kStepFormats = {2, 3};  // the step contracts this runtime runs

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
  if (find(sig.inputs, "input_ids")->shape.size() != 2 || sig.outputs[0].shape.size() != 2 ||
      find(sig.inputs, "cache_lengths")->shape.size() != 1 || find(sig.inputs, "input_lengths")->shape.size() != 1) {
    return "input_ids and the logits are not 2-D, or the lengths not 1-D";
  }
  if (sig.state.empty() || std::any_of(sig.state.begin(), sig.state.end(), [](const TensorSpec& s) { return s.shape.size() != 4; })) {
    return "its state is not a KV cache of [batch, positions, heads, head dim] per layer";
  }
  for (size_t i = 0; i < kStepInputs.size(); ++i) {  // Package::generate passes them by position
    if (sig.inputs[i].name != kStepInputs[i]) {
      return "its inputs are not in a generation step's order (input_ids, cache_lengths, input_lengths)";
    }
  }
  return "";
}

// The record's numbers against the model's sizes, then its ids against its vocabulary.
std::string size_problem(const Generation& g, const Signature& sig) {
  const TensorSpec &ids = *find(sig.inputs, "input_ids"), &logits = sig.outputs[0];
  const TensorSpec &held = *find(sig.inputs, "cache_lengths"), &fed = *find(sig.inputs, "input_lengths");
  // a step runs for the whole batch, or for its first R rows: one dim from 1 to the batch on every input and the logits
  const ShapeEntry& rows = ids.shape[0];
  if (!rows.is_static()) {
    auto span = sig.dims.find(rows.name);
    // (every dim a shape names has a range: the signature's reading refuses one without)
    if (span == sig.dims.end() || span->second.min != 1 || span->second.max != g.batch_size) {
      const std::string ran = span == sig.dims.end() ? "?..?" : std::to_string(span->second.min) + ".." + std::to_string(span->second.max);
      return "the step's rows " + rows.name + " run " + ran + ", not 1.." + std::to_string(g.batch_size) + " (its batch_size)";
    }
    for (const ShapeEntry* other : {&held.shape[0], &fed.shape[0], &logits.shape[0]}) {
      if (other->is_static() || other->name != rows.name) return "batch_size is " + rows.name + " but the model's is " + entry_text(*other);
    }
  }
  struct Size {
    const char* what;
    ShapeEntry size;
    int64_t expected;
  };
  std::vector<Size> sizes = {{"vocab_size", logits.shape[1], g.vocab_size}};
  if (rows.is_static()) {
    for (const ShapeEntry* entry : {&ids.shape[0], &held.shape[0], &fed.shape[0], &logits.shape[0]}) sizes.push_back({"batch_size", *entry, g.batch_size});
  }
  for (const auto& cache : sig.state) {  // per layer [B, max_len + 1, heads, head dim]: slot max_len is the padding's
    sizes.push_back({"batch_size", cache.shape[0], g.batch_size});
    ShapeEntry positions = cache.shape[1];
    if (positions.is_static()) positions.size -= 1;
    sizes.push_back({"max_seq_len", positions, g.max_seq_len});
  }
  for (const auto& s : sizes) {
    if (!s.size.is_static() || s.size.size != s.expected) {
      return std::string(s.what) + " is " + std::to_string(s.expected) + " but the model's is " + entry_text(s.size);
    }
  }
  if (ids.value_range && ids.value_range->second != g.vocab_size - 1) {
    return "vocab_size is " + std::to_string(g.vocab_size) + " but the model's token ids go up to " +
           std::to_string(ids.value_range->second);
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
  if (!g.step_format || std::find(kStepFormats.begin(), kStepFormats.end(), *g.step_format) == kStepFormats.end()) {
    std::string made = !g.step_format ? "an aotc from before the generation step had its own KV cache"
                                      : "generation step format " + std::to_string(*g.step_format) +
                                            ", which this runtime does not know (it runs formats 2 and 3)";
    throw package_error("package " + folder + " was built with " + made + "; export and build it again with this aotc");
  }
  std::string problem = form_problem(manifest.signature);
  if (problem.empty()) problem = size_problem(g, manifest.signature);
  if (problem.empty()) problem = id_problem(g, manifest);
  if (!problem.empty()) {
    throw package_error("package " + folder + ": its generation record does not match its compiled model: " + problem +
                        "; rebuild it with `aotc build --force`");
  }
}

}  // namespace aotc
