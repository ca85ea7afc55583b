// check_generation: a text-generation package's `generation` record against its signature, at load,
// before anything is allocated from the record (Package::generate sizes its buffers and batch from it).
// The checks, their order and messages are aotc_runtime/generation_record.py's; the signature is the
// compiled model's own (check_contract ran first), so a record that disagrees with it was edited.
// The step's shapes (aotc/export/row_cache.py), `step_format` 4: packed tokens, each fed to a row
// of the cache at a position,
//
//   step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab];
//   state key_cache_i / value_cache_i [B, max_len + 1, kv heads, head dim]
//
// T a dim from 1 to B x max_len (a prefill of every row's whole cache at most), R the batch B, or a
// dim from 1 to B (the logits of R of the step's tokens). A package of another step format (the
// padded windows of formats 2 and 3, or none: from before aotc owned the cache) is refused first.
#include <algorithm>
#include <array>
#include <string>

#include "aotc/error.h"
#include "aotc/manifest.h"

namespace aotc {
namespace {

// The step's inputs, in the order Package::generate passes them.
constexpr std::array<const char*, 4> kStepInputs = {"input_ids", "rows", "positions", "picks"};
constexpr int64_t kStepFormat = 4;  // the step contract this runtime runs

std::string entry_text(const ShapeEntry& entry) { return entry.is_static() ? std::to_string(entry.size) : entry.name; }

bool same(const ShapeEntry& a, const ShapeEntry& b) { return a.is_static() ? a.size == b.size : !b.is_static() && a.name == b.name; }

const TensorSpec* find(const std::vector<TensorSpec>& specs, const std::string& name) {
  auto found = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  return found == specs.end() ? nullptr : &*found;
}

// The step's form: its inputs by name, one output, 1-D inputs and 2-D logits ("" when it has it).
std::string form_problem(const Signature& sig) {
  std::string missing;
  for (const char* name : kStepInputs)
    if (!find(sig.inputs, name)) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty()) return "the model is not one generation step (it lacks " + missing + ")";
  if (sig.outputs.size() != 1) {
    return "the model has " + std::to_string(sig.outputs.size()) + " outputs, a generation step has 1 (logits)";
  }
  bool flat = std::all_of(kStepInputs.begin(), kStepInputs.end(), [&](const char* name) { return find(sig.inputs, name)->shape.size() == 1; });
  if (!flat || sig.outputs[0].shape.size() != 2) return "input_ids, rows, positions and picks are not 1-D, or the logits not 2-D";
  // a token, its row and its position: one entry of each per token
  const ShapeEntry& tokens = find(sig.inputs, "input_ids")->shape[0];
  for (const char* name : {"rows", "positions"}) {
    if (!same(find(sig.inputs, name)->shape[0], tokens)) return "input_ids, rows and positions do not share one length (the step's tokens)";
  }
  if (sig.state.empty() || std::any_of(sig.state.begin(), sig.state.end(), [](const TensorSpec& s) { return s.shape.size() != 4; })) {
    return "its state is not a KV cache of [batch, positions, heads, head dim] per layer";
  }
  for (size_t i = 0; i < kStepInputs.size(); ++i) {  // Package::generate passes them by position
    if (sig.inputs[i].name != kStepInputs[i]) {
      return "its inputs are not in a generation step's order (input_ids, rows, positions, picks)";
    }
  }
  return "";
}

// The record's numbers against the model's sizes, then its ids against its vocabulary.
std::string size_problem(const Generation& g, const Signature& sig) {
  const TensorSpec &ids = *find(sig.inputs, "input_ids"), &logits = sig.outputs[0];
  // the logits of the whole batch's picks, or of R picks: one dim from 1 to the batch on picks and the logits
  const ShapeEntry& picked = find(sig.inputs, "picks")->shape[0];
  if (!picked.is_static()) {
    auto span = sig.dims.find(picked.name);
    // (every dim a shape names has a range: the signature's reading refuses one without)
    if (span == sig.dims.end() || span->second.min != 1 || span->second.max != g.batch_size) {
      const std::string ran = span == sig.dims.end() ? "?..?" : std::to_string(span->second.min) + ".." + std::to_string(span->second.max);
      return "the step's picks " + picked.name + " run " + ran + ", not 1.." + std::to_string(g.batch_size) + " (its batch_size)";
    }
    if (!same(logits.shape[0], picked)) return "batch_size is " + picked.name + " but the model's is " + entry_text(logits.shape[0]);
  }
  struct Size {
    const char* what;
    ShapeEntry size;
    int64_t expected;
  };
  std::vector<Size> sizes;
  if (picked.is_static()) {
    for (const ShapeEntry* entry : {&picked, &logits.shape[0]}) sizes.push_back({"batch_size", *entry, g.batch_size});
  }
  sizes.push_back({"vocab_size", logits.shape[1], g.vocab_size});
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
  if (g.step_format != kStepFormat) {
    std::string made;
    if (!g.step_format) {
      made = "an aotc from before the generation step had its own KV cache";
    } else if (*g.step_format < kStepFormat) {  // formats 2 and 3 fed each row a padded window
      made = "generation step format " + std::to_string(*g.step_format) + ", from an aotc before the step packed its tokens (this runtime runs format " +
             std::to_string(kStepFormat) + ")";
    } else {
      made = "generation step format " + std::to_string(*g.step_format) + ", which this runtime does not know (it runs format " +
             std::to_string(kStepFormat) + ")";
    }
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
