// manifest.json, typed: the contract of docs/package-format.md, read as strictly as the Python
// runtime reads it (aotc_runtime/manifest.py). A field that is missing or has the wrong type is a
// package error (exit 7) naming the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace aotc {

inline constexpr int kFormatVersion = 4;  // 4: the program updates its state in place (signature.state_in_place)
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kSignatureFile = "manifest.json.sig";  // `aotc sign`; the one unlisted file
inline constexpr const char* kContractKey = "aotc.contract";  // AOTInductor metadata: what the model was built as
inline constexpr const char* kModelFile = "model.pt2";
inline constexpr const char* kStateFile = "state.pt";

// One entry of a shape: a static size, or the name of a dynamic dim (outputs: an expression of dims).
struct ShapeEntry {
  int64_t size = -1;  // >= 0 when static
  std::string name;   // set when dynamic
  bool is_static() const { return size >= 0; }
};

struct TensorSpec {
  std::string name;
  std::string dtype;  // "float32", "int64", ... (aotc_runtime.DTYPES)
  std::vector<ShapeEntry> shape;
  std::optional<std::pair<int64_t, int64_t>> value_range;  // inputs: integer inputs' [low, high]
  bool keyword = false;
};

struct DimRange {
  int64_t min = 0, max = 0, example = 0;
};

struct Signature {
  std::vector<TensorSpec> inputs, outputs, state;
  std::map<std::string, DimRange> dims;
  std::string output_structure;  // tensor | tuple | list | dict ("" before format 2)
  // true: the program writes the state's new values into its state inputs; false (packages from
  // before 2026-11-26): it returns them after the outputs
  bool state_in_place = false;
};

// One entry of `specializations`: a static-shape member package that runs calls whose dims have
// these values (docs/cpp-runner.md, "Specialized members").
struct Specialization {
  std::map<std::string, int64_t> dims;  // dim name -> size, every one in signature.dims' range
  std::string package;                   // member folder, relative to the package (checked like `files`)
};

// `generation` (a package from `aotc export --task text-generation`): its program is one step of
// generation over a static KV cache (the state) of batch_size x max_seq_len (docs/package-format.md).
struct Generation {
  int64_t batch_size = 0, max_seq_len = 0, vocab_size = 0;
  std::vector<int64_t> eos_token_ids;  // generation stops at any of them
  std::optional<int64_t> pad_token_id;
  std::string tokenizer;  // "" when the package carries none
  std::optional<int64_t> sliding_window;  // the fewest earlier positions a layer attends to (0: none)
  std::optional<int64_t> step_format;     // the step's contract (generation_record.cpp); kStepFormat runs
};

// `shared_weights` (aotc build --specialize): one file of the constants of every program in
// `programs` ("." the package's model, else a member folder), whose model.pt2 carries none; an
// entry "FOLDER::NAME" is that program's own NAME (docs/package-format.md).
struct SharedWeights {
  std::string file;
  std::vector<std::string> programs;
};

struct Manifest {
  int format_version = 0;
  std::string aotc_version, created, mode, precision;
  std::string torch, platform;                            // toolchain the package needs
  std::string device_type;                                // "cpu" or "cuda"
  std::string gpu_name, compute_capability;               // cuda packages
  std::string tiles_tuned_on;  // product_tiles.tuned_on: the GPU the build timed its kernels' tiles on
  bool cuda_graphs = false, tf32 = false;                 // runtime settings
  bool cudnn_benchmark = false;  // cuDNN times its convolution algorithms (aotc build --cudnn-benchmark)
  bool finished = true;                                   // false: numeric_check pending (a build that never ended)
  Signature signature;
  std::vector<std::pair<std::string, std::string>> files;  // relative path -> sha256, in file order
  std::string contract;  // JSON: the manifest fields the compiled model must carry (model_contract in Python)
  std::string cpu_isa;                    // as asked with `aotc build --cpu-isa`
  std::vector<std::string> cpu_features;  // extensions the compiled C++ may use (/proc/cpuinfo names)
  std::string aten_cpu_capability;        // int4 CPU tiles: the torch CPU capability whose layout they use
  std::vector<Specialization> specializations;
  std::optional<Generation> generation;
  std::optional<SharedWeights> shared_weights;
};

// Read and check FOLDER/manifest.json; throws aotc::Error (exit 7) with the Python runtime's messages.
Manifest read_manifest(const std::string& folder);

// FOLDER/manifest.json's bytes (at most 16 MiB, a regular file, read without blocking), and the
// check of bytes read that way: a caller that verifies the bytes (a signature) parses those very
// bytes, never a second read of the file.
std::string read_manifest_bytes(const std::string& folder);
Manifest parse_manifest(const std::string& folder, const std::string& text);

// FOLDER/manifest.json's `backend` after the manifest's own checks (JSON, format, hash) but before
// the field checks only an AOTInductor manifest passes: how a package tells an ONNX Runtime member,
// which this runtime skips, from a broken one, which it refuses.
std::string read_backend(const std::string& folder);

// Refuse a package whose files differ from the manifest's hashes (exit 7).
void verify_files(const std::string& folder, const Manifest& manifest);

// Refuse a package built for another torch release, platform or CPU, or never finished (exit 7).
void check_compatible(const std::string& folder, const Manifest& manifest);

// Refuse a CUDA package on a machine with no usable GPU or a GPU of another architecture (exit 7).
// It initialises CUDA (about 100 ms on the H100 host): Package::load runs it beside the hash check.
void check_device(const std::string& folder, const Manifest& manifest);
// What to say when the build timed its kernels' tiles on another GPU (of the same architecture:
// check_device refuses any other); "" when it did not
std::string tuned_elsewhere(const Manifest& manifest, const std::string& here);

// Refuse a package whose manifest does not describe its compiled model: METADATA is the model's
// AOTInductor metadata (exit 7, naming the first difference with both sides).
void check_contract(const std::string& folder, const Manifest& manifest,
                    const std::unordered_map<std::string, std::string>& metadata);

// Refuse a text-generation package whose `generation` record disagrees with its signature (which
// check_contract has compared with the compiled model): vocab_size, batch_size and max_seq_len
// against the sizes of the step's inputs, logits and KV cache, and pad / end-of-sequence ids
// inside the vocabulary (exit 7). A lie there would reach a kernel as an out-of-range index (an
// embedding's bounds check aborts the process) or ask for memory the package never needs.
void check_generation(const std::string& folder, const Manifest& manifest);

}  // namespace aotc
