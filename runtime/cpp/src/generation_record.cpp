// check_generation: a text-generation package's `generation` record against its signature, at load,
// before anything is allocated from the record (Package::generate sizes its mask and batch from it).
// The signature is the compiled model's own (check_contract ran first), so a record that disagrees
// with it is what was edited. The step's shapes (aotc/export/text_generation.py):
//
//   step(input_ids [B, S], position_ids [B, S], cache_position [S], attention_mask [B, max_len])
//       -> logits [B, vocab]; state key_cache_i / value_cache_i [B, heads, max_len, head dim]
#include <array>
#include <string>

#include "aotc/error.h"
#include "aotc/manifest.h"

namespace aotc {
namespace {

// The step's inputs, in the order Package::generate passes them.
constexpr std::array<const char*, 4> kStepInputs = {"input_ids", "position_ids", "cache_position", "attention_mask"};

class RecordCheck {
 public:
  RecordCheck(const std::string& folder, const Manifest& manifest) : folder_(folder), sig_(manifest.signature) {}

  [[noreturn]] void refuse(const std::string& problem) const {
    throw package_error("package " + folder_ + ": its generation record does not match its compiled model: " + problem +
                        "; rebuild it with `aotc build --force`");
  }

  // The record's `field` is `value`; the size of `spec` on `axis` must be it (a dynamic dim: its
  // range must hold it). `what` names the tensor, `unit` what that axis counts.
  void size(const char* field, int64_t value, const TensorSpec& spec, size_t axis, const std::string& what,
            const std::string& unit) const {
    if (axis >= spec.shape.size()) refuse(what + " has " + std::to_string(spec.shape.size()) + " dimension(s), not a " + unit + " axis");
    const ShapeEntry& entry = spec.shape[axis];
    std::string said = std::string(field) + " is " + std::to_string(value) + " but " + what + " ";
    if (entry.is_static()) {
      if (entry.size != value) refuse(said + "has " + std::to_string(entry.size) + " " + unit);
      return;
    }
    auto range = sig_.dims.find(entry.name);
    if (range == sig_.dims.end()) refuse(said + "has " + entry.name + " " + unit + ", not a fixed size");
    if (value < range->second.min || value > range->second.max) {
      refuse(said + "has " + std::to_string(range->second.min) + ".." + std::to_string(range->second.max) + " " + unit);
    }
  }

  void step_inputs() const {
    bool same = sig_.inputs.size() == kStepInputs.size();
    std::string names;
    for (size_t i = 0; i < sig_.inputs.size(); ++i) {
      names += (i ? ", " : "") + sig_.inputs[i].name;
      same = same && sig_.inputs[i].name == kStepInputs[i];
    }
    if (!same) refuse("its inputs are (" + names + "), not a generation step's (input_ids, position_ids, cache_position, attention_mask)");
    if (sig_.outputs.empty()) refuse("it has no output (a generation step returns the logits)");
  }

  // An id the embedding has a row for.
  void in_vocabulary(const std::string& field, int64_t id, int64_t vocab) const {
    if (id < 0 || id >= vocab) refuse(field + " " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  }

 private:
  std::string folder_;
  const Signature& sig_;
};

bool is_kv_cache(const TensorSpec& spec) {
  return spec.shape.size() == 4 && (spec.name.rfind("key_cache_", 0) == 0 || spec.name.rfind("value_cache_", 0) == 0);
}

}  // namespace

void check_generation(const std::string& folder, const Manifest& manifest) {
  if (!manifest.generation) return;
  const Generation& g = *manifest.generation;
  const Signature& sig = manifest.signature;
  RecordCheck check(folder, manifest);
  check.step_inputs();
  const TensorSpec &ids = sig.inputs[0], &positions = sig.inputs[1], &mask = sig.inputs[3], &logits = sig.outputs[0];
  check.size("vocab_size", g.vocab_size, logits, 1, "the logits", "columns");
  for (const TensorSpec* spec : {&ids, &positions, &mask}) check.size("batch_size", g.batch_size, *spec, 0, spec->name, "rows");
  check.size("batch_size", g.batch_size, logits, 0, "the logits", "rows");
  check.size("max_seq_len", g.max_seq_len, mask, 1, "attention_mask", "columns");
  for (const auto& spec : sig.state) {
    if (!is_kv_cache(spec)) continue;
    check.size("batch_size", g.batch_size, spec, 0, "the KV cache's " + spec.name, "sequences");
    check.size("max_seq_len", g.max_seq_len, spec, 2, "the KV cache's " + spec.name, "positions");
  }
  if (g.pad_token_id) check.in_vocabulary("pad_token_id", *g.pad_token_id, g.vocab_size);
  for (int64_t id : g.eos_token_ids) check.in_vocabulary("eos_token_ids holds", id, g.vocab_size);
}

}  // namespace aotc
