// aotc::Package: loading (manifest, hashes, versions, state) and calling (input checks, state,
// TF32, CUDA graphs) with the semantics of runtime/aotc_runtime/package.py.
#include "aotc/package.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "aotc/signing.h"
#include "cuda_graphs.h"
#include "input_check.h"

namespace fs = std::filesystem;

namespace aotc {
namespace {

const std::map<std::string, at::ScalarType> kTypes = {
    {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16}, {"float64", at::kDouble},
    {"int64", at::kLong},    {"int32", at::kInt},    {"int16", at::kShort},       {"int8", at::kChar},
    {"uint8", at::kByte},    {"bool", at::kBool}};

std::string first_line(const std::string& text) {
  size_t start = text.find_first_not_of(" \n\t");
  if (start == std::string::npos) return "";
  return text.substr(start, text.find('\n', start) - start);
}

// One tensor of state.pt, before anything is cloned from it: the manifest's shape and dtype (a
// tensor saved as one value expanded, an empty KV cache, is one element on disk whatever shape it
// claims); a dense tensor laid out as the compiled program reads it, whole (contiguous) or one
// value expanded (all strides 0, as aotc/compiler/state_file.py's compact writes it), inside its
// storage; and no NaN, which the first step would carry into every token after it (an inf may be
// a state's start: a running maximum's -inf).
void check_state_tensor(const std::string& folder, const TensorSpec& spec, const at::Tensor& t) {
  auto refuse = [&](const std::string& problem) {
    throw package_error("package " + folder + ": its " + kStateFile + " holds " + spec.name + " " + problem +
                        "; rebuild it with `aotc build --force`");
  };
  std::vector<int64_t> expected;
  for (const auto& entry : spec.shape) expected.push_back(entry.size);
  if (t.sizes().vec() != expected || t.scalar_type() != scalar_type(spec.dtype)) refuse("in another shape or dtype than the manifest says");
  // the compiled model reads and writes its state in place at contiguous strides: any other
  // layout of the right values computes something else (aotc_runtime/package.py's _plain_layout)
  const std::string layout = "in a layout the model does not read (not a dense contiguous tensor)";
  if (t.layout() != at::kStrided || t.is_quantized() || t.is_conj() || t.is_neg()) refuse(layout);  // before strides(): a sparse one has none
  const auto strides = t.strides();
  const bool expanded = t.numel() > 0 && std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
  if (!t.is_contiguous() && !expanded) refuse(layout);
  at::Tensor stored = expanded ? t.as_strided({1}, {1}) : t;  // the values on disk
  auto needed = static_cast<size_t>(t.storage_offset() + stored.numel()) * t.element_size();
  if (!t.storage() || t.storage().nbytes() < needed) refuse("as a view past the end of its storage");
  if (at::isFloatingType(t.scalar_type()) && at::isnan(stored).any().item<bool>()) refuse("with NaN values");
}

std::vector<at::Tensor> read_state(const std::string& folder, const Manifest& manifest) {
  const auto& specs = manifest.signature.state;
  if (specs.empty()) return {};
  fs::path path = fs::path(folder) / kStateFile;
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    // TorchScript's unpickler: tensors and containers only, no arbitrary Python objects run.
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception&) {
    throw package_error("package " + folder + ": its " + kStateFile + " could not be read; rebuild it with `aotc build --force`");
  }
  std::vector<at::Tensor> state;
  if (value.isList()) {
    for (const auto& item : value.toListRef()) {
      if (item.isTensor()) state.push_back(item.toTensor());
    }
  }
  if (!value.isList() || state.size() != specs.size() || value.toListRef().size() != specs.size()) {
    throw package_error("package " + folder + ": its " + kStateFile + " does not hold the " + std::to_string(specs.size()) +
                        " tensor(s) the manifest lists; rebuild it");
  }
  for (size_t i = 0; i < specs.size(); ++i) check_state_tensor(folder, specs[i], state[i]);
  return state;
}

using WeightMap = std::unordered_map<std::string, at::Tensor>;

// The shared weights file's tensors on `device` (aotc_runtime/shared_weights.py): names to whole
// tensors, read with TorchScript's unpickler (no Python objects run).
std::shared_ptr<const WeightMap> read_shared_weights(const std::string& folder, const Manifest& manifest, at::Device device) {
  const std::string& file = manifest.shared_weights->file;
  std::ifstream in(fs::path(folder) / file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception&) {
    throw package_error("package " + folder + ": its " + file + " could not be read; rebuild it with `aotc build --force`");
  }
  if (!value.isGenericDict()) throw package_error("package " + folder + ": its " + file + " is not a map of names to tensors; rebuild it");
  auto weights = std::make_shared<WeightMap>();
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw package_error("package " + folder + ": its " + file + " is not a map of names to tensors; rebuild it");
    }
    at::Tensor t = entry.value().toTensor();
    // a compiled program reads its constants as dense arrays: never a view past its storage's end
    auto needed = static_cast<size_t>(t.storage_offset() + t.numel()) * t.element_size();
    if (!t.is_contiguous() || t.storage().nbytes() < needed) {
      throw package_error("package " + folder + ": " + file + " holds " + entry.key().toStringRef() + " as a view, not a whole tensor; rebuild it");
    }
    (*weights)[entry.key().toStringRef()] = t.to(device);
  }
  return weights;
}

// Give the compiled program `program` ("." or a member folder) its constants from `weights`, in place.
void point_at_weights(torch::inductor::AOTIModelPackageLoader& loader, const WeightMap& weights, const std::string& program,
                      const std::string& folder) {
  std::unordered_map<std::string, at::Tensor> constants;
  for (const auto& name : loader.get_constant_fqns()) {
    auto own = weights.find(program + "::" + name);
    auto shared = own != weights.end() ? own : weights.find(name);
    if (shared == weights.end()) {
      throw package_error("package " + folder + ": its shared weights hold no '" + name + "' for " + program +
                          "; rebuild it with `aotc build --force`");
    }
    constants[name] = shared->second;
  }
  try {
    loader.load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true, /*user_managed=*/true);
  } catch (const std::exception& exc) {
    throw package_error("package " + folder + ": " + program + " refused its shared weights (" + first_line(exc.what()) + "); rebuild it");
  }
}

// cuDNN's algorithm benchmarking on for the duration of the call of a package built with
// --cudnn-benchmark (only that flag: TF32 stays as the precision says).
class CudnnBenchmarkScope {
 public:
  explicit CudnnBenchmarkScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    before_ = at::globalContext().benchmarkCuDNN();
    at::globalContext().setBenchmarkCuDNN(true);
  }
  ~CudnnBenchmarkScope() {
    if (enabled_) at::globalContext().setBenchmarkCuDNN(before_);
  }

 private:
  bool enabled_, before_ = false;
};

// TF32 on for the duration of a tf32 package's call, the caller's settings put back after.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    auto& ctx = at::globalContext();
    matmul_ = ctx.allowTF32CuBLAS();
    cudnn_ = ctx.allowTF32CuDNN();
    ctx.setAllowTF32CuBLAS(true);
    ctx.setAllowTF32CuDNN(true);
  }
  ~Tf32Scope() {
    if (!enabled_) return;
    at::globalContext().setAllowTF32CuBLAS(matmul_);
    at::globalContext().setAllowTF32CuDNN(cudnn_);
  }

 private:
  bool enabled_, matmul_ = false, cudnn_ = false;
};

// "B=8" or "B=8, S=128": a member's dims, as the messages below name them.
std::string dims_text(const std::map<std::string, int64_t>& dims) {
  std::string out;
  for (const auto& [name, size] : dims) out += (out.empty() ? "" : ", ") + name + "=" + std::to_string(size);
  return out;
}

std::string shape_text(const std::vector<ShapeEntry>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + (shape[i].is_static() ? std::to_string(shape[i].size) : shape[i].name);
  return out + "]";
}

// Refuse a member that is not the top-level model at its sizes: a call the top-level signature
// accepted must fit the member's too, and give what the dynamic model would (same mode, precision,
// device). Checked on the member's manifest, before its native code loads.
void check_member(const std::string& folder, const Manifest& top, const Specialization& spec, const Manifest& member) {
  auto refuse = [&](const std::string& problem) {
    throw package_error("package " + folder + ": its specialized member " + spec.package + " " + problem +
                        "; rebuild it with `aotc build --force`");
  };
  auto differs = [&](const std::string& field, const std::string& in_member, const std::string& in_top) {
    refuse("does not match the package: " + field + " is " + in_member + " in the member but " + in_top + " in the package" +
           (field.rfind("signature", 0) == 0 ? " (with " + dims_text(spec.dims) + ")" : ""));
  };
  if (member.mode != top.mode) differs("mode", member.mode, top.mode);
  if (member.precision != top.precision) differs("precision", member.precision, top.precision);
  if (member.device_type != top.device_type) differs("device.type", member.device_type, top.device_type);
  // Nothing nests: a member's state would never reach the dynamic model, and members of members
  // could loop through a linked folder when hashes are not verified.
  if (!member.signature.state.empty()) refuse("has state, which a specialized package never has");
  if (!member.specializations.empty()) refuse("has specializations of its own");
  const auto& want = top.signature.inputs;
  const auto& have = member.signature.inputs;
  if (have.size() != want.size()) differs("the number of inputs", std::to_string(have.size()), std::to_string(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    std::string where = "signature.inputs[" + std::to_string(i) + "]";
    if (have[i].name != want[i].name) differs(where + ".name", have[i].name, want[i].name);
    if (have[i].dtype != want[i].dtype) differs(where + ".dtype", have[i].dtype, want[i].dtype);
    std::vector<ShapeEntry> shape = want[i].shape;
    for (auto& entry : shape) {
      auto fixed = entry.is_static() ? spec.dims.end() : spec.dims.find(entry.name);
      if (fixed != spec.dims.end()) entry = ShapeEntry{fixed->second, ""};
    }
    bool same = shape.size() == have[i].shape.size();
    for (size_t axis = 0; same && axis < shape.size(); ++axis)
      same = shape[axis].size == have[i].shape[axis].size && shape[axis].name == have[i].shape[axis].name;
    if (!same) differs(where + ".shape", shape_text(have[i].shape), shape_text(shape));
  }
}

}  // namespace

at::ScalarType scalar_type(const std::string& dtype) { return kTypes.at(dtype); }

std::string dtype_name(at::ScalarType type) {
  for (const auto& [name, t] : kTypes)
    if (t == type) return name;
  return c10::toString(type);
}

Package::~Package() = default;
Package::Package(Package&&) noexcept = default;
Package& Package::operator=(Package&&) noexcept = default;

Package Package::load(const std::string& folder, const LoadOptions& options) {
  using Clock = std::chrono::steady_clock;
  LoadTimes unused;
  LoadTimes& times = options.times ? *options.times : unused;
  auto since = [](Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  auto started = Clock::now();
  Package package;
  package.folder_ = folder;
  bool signed_ = !options.public_key.empty();
  // Read once: the bytes whose signature is checked are the bytes parsed.
  std::string text = signed_ ? verify_signature(folder, options.public_key) : read_manifest_bytes(folder);
  package.manifest_ = parse_manifest(folder, text);
  check_compatible(folder, package.manifest_);
  times.manifest_ms = since(started);
  // CUDA's initialisation (the GPU check needs it, the loader would pay it anyway) and the hash
  // check need nothing of each other, and both must pass before any of the package's code is
  // loaded: they overlap. A device refusal still comes before a hash refusal, as in sequence.
  std::exception_ptr device_error, hash_error;
  std::thread device_check([&, started = Clock::now()] {
    try {
      check_device(folder, package.manifest_);
    } catch (...) {
      device_error = std::current_exception();
    }
    times.device_ms = since(started);
  });
  started = Clock::now();
  try {
    // A signature vouches for the other files only through their hashes: never skipped then.
    if (options.verify || signed_) verify_files(folder, package.manifest_);
  } catch (...) {
    hash_error = std::current_exception();
  }
  times.hashes_ms = since(started);
  device_check.join();
  if (device_error) std::rethrow_exception(device_error);
  if (hash_error) std::rethrow_exception(hash_error);
  started = Clock::now();
  bool cuda = package.manifest_.device_type == "cuda";
  package.device_ = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  try {
    package.loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        (fs::path(folder) / kModelFile).string(), "model", package.manifest_.cuda_graphs, 1, cuda ? 0 : -1);
  } catch (const std::exception& exc) {
    throw package_error("package " + folder + " could not be loaded: " + first_line(exc.what()) +
                        "; rebuild it with `aotc build --force`");
  }
  check_contract(folder, package.manifest_, package.loader_->get_metadata());
  check_generation(folder, package.manifest_);  // the signature is now the model's: the record must agree
  const auto& shared = package.manifest_.shared_weights;
  if (shared) package.shared_weights_ = read_shared_weights(folder, package.manifest_, package.device_);
  if (shared && std::find(shared->programs.begin(), shared->programs.end(), ".") != shared->programs.end()) {
    point_at_weights(*package.loader_, *package.shared_weights_, ".", folder);
  } else if (options.shared_weights) {
    package.shared_weights_ = options.shared_weights;
    point_at_weights(*package.loader_, *options.shared_weights, options.shared_program, folder);
  }
  for (const auto& spec : package.manifest_.specializations) {
    std::string member_folder = (fs::path(folder) / spec.package).string();
    if (!fs::is_directory(member_folder)) {
      throw package_error("package " + folder + ": its specialized member " + spec.package +
                          " is missing; rebuild it with `aotc build --force`");
    }
    // This runner has no ONNX Runtime; the dynamic model gives the same outputs, only slower.
    if (read_backend(member_folder) == "onnxruntime") {
      std::cerr << "note: " << spec.package << " is an onnxruntime model; " << dims_text(spec.dims)
                << " runs the dynamic model in the C++ runner" << std::endl;
      continue;
    }
    check_member(folder, package.manifest_, spec, read_manifest(member_folder));
    // The top-level hash check covered the member's files (they are in its `files`), so it is not
    // repeated; the member's own manifest hash, compatibility and contract checks run in load().
    LoadOptions member_options = options;
    member_options.verify = false;
    member_options.times = nullptr;
    member_options.public_key.clear();  // its manifest is one of the files the signed manifest hashes
    member_options.shared_weights = nullptr;
    if (shared && std::find(shared->programs.begin(), shared->programs.end(), spec.package) != shared->programs.end()) {
      member_options.shared_weights = package.shared_weights_;
      member_options.shared_program = spec.package;
    }
    package.members_.push_back(
        {spec.dims, spec.package, std::make_unique<Package>(Package::load(member_folder, member_options))});
  }
  times.loader_ms = since(started);
  started = Clock::now();
  for (const auto& t : read_state(folder, package.manifest_)) package.initial_state_.push_back(t.to(package.device_));
  package.reset_state();
  times.state_ms = since(started);
  if (cuda && package.manifest_.cuda_graphs) {
    package.graphs_ = make_cuda_graphs(
        [loader = package.loader_.get()](const std::vector<at::Tensor>& flat) { return loader->run(flat); },
        package.device_, options.reuse_outputs,
        // the state inputs a replay writes into its own buffers, copied back to the state
        package.manifest_.signature.state_in_place ? package.state_.size() : 0);
  }
  return package;
}

void Package::reset_state() {
  if (manifest_.signature.state_in_place && state_.size() == initial_state_.size()) {
    // in place: a decode graph replays on these very tensors (generate.cpp)
    for (size_t i = 0; i < state_.size(); ++i) state_[i].copy_(initial_state_[i]);
    return;
  }
  state_.clear();
  for (const auto& t : initial_state_) state_.push_back(t.clone());
}

size_t Package::cuda_graphs_captured() const {
  size_t captured = graphs_ ? graphs_->captured() : 0;
  for (const auto& member : members_) captured += member.package->cuda_graphs_captured();
  return captured;
}

void Package::check_inputs(const std::vector<at::Tensor>& inputs) const {
  const Signature& sig = manifest_.signature;
  if (inputs.size() != sig.inputs.size()) {
    std::string names;
    for (const auto& s : sig.inputs) names += (names.empty() ? "" : ", ") + s.name;
    throw input_error("the package takes " + std::to_string(sig.inputs.size()) + " input(s) (" + names + "), " +
                      std::to_string(inputs.size()) + " given");
  }
  InputCheck check(sig);
  for (size_t index = 0; index < inputs.size(); ++index) check.check(index, inputs[index].sizes(), dtype_name(inputs[index].scalar_type()));
}

std::vector<at::Tensor> Package::random_inputs(uint64_t seed) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> tensors;
  for (const auto& spec : manifest_.signature.inputs) {
    std::vector<int64_t> shape;
    for (const auto& e : spec.shape) shape.push_back(e.is_static() ? e.size : manifest_.signature.dims.at(e.name).example);
    at::ScalarType type = scalar_type(spec.dtype);
    at::Tensor t;
    if (type == at::kBool) {
      t = at::randint(0, 2, shape, generator, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
    } else if (at::isFloatingType(type)) {
      t = at::randn(shape, generator).to(type);
    } else {
      auto [low, high] = spec.value_range.value_or(std::make_pair<int64_t, int64_t>(0, 9));
      t = at::randint(low, high + 1, shape, generator, at::TensorOptions().dtype(type));
    }
    tensors.push_back(t.to(device_));
  }
  return tensors;
}

const Package::Member* Package::member_for(const std::vector<at::Tensor>& inputs) const {
  if (members_.empty()) return nullptr;
  // Each named dim's size in these inputs (check_inputs has made inputs sharing a name agree).
  std::map<std::string, int64_t> sizes;
  const auto& specs = manifest_.signature.inputs;
  for (size_t i = 0; i < specs.size() && i < inputs.size(); ++i)
    for (size_t axis = 0; axis < specs[i].shape.size() && axis < static_cast<size_t>(inputs[i].dim()); ++axis)
      if (!specs[i].shape[axis].is_static()) sizes[specs[i].shape[axis].name] = inputs[i].size(static_cast<int64_t>(axis));
  for (const auto& member : members_) {
    bool match = std::all_of(member.dims.begin(), member.dims.end(), [&](const auto& dim) {
      auto found = sizes.find(dim.first);
      return found != sizes.end() && found->second == dim.second;
    });
    if (match) return &member;  // entries are tried in manifest order
  }
  return nullptr;
}

std::string Package::model_for(const std::vector<at::Tensor>& inputs) const {
  const Member* member = member_for(inputs);
  return member ? member->path : kModelFile;
}

std::vector<at::Tensor> Package::call_flat(const std::vector<at::Tensor>& flat, bool graphs) {
  Tf32Scope tf32(manifest_.tf32);
  CudnnBenchmarkScope cudnn(manifest_.cudnn_benchmark);
  if (graphs && graphs_) return graphs_->run(flat);
  return loader_->run(flat);
}

std::vector<at::Tensor> Package::run(const std::vector<at::Tensor>& inputs) { return run_step(inputs, true); }

std::vector<at::Tensor> Package::run_step(const std::vector<at::Tensor>& inputs, bool graphs) {
  check_inputs(inputs);
  // The top-level check comes first, so errors name the package's dims, not a member's sizes.
  if (const Member* member = member_for(inputs)) return member->package->run(inputs);
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs) flat.push_back(t.device() == device_ ? t : t.to(device_));
  flat.insert(flat.end(), state_.begin(), state_.end());
  std::vector<at::Tensor> outputs = call_flat(flat, graphs);
  size_t n_outputs = manifest_.signature.outputs.size();
  // The program wrote the state's new values into the state it was given (signature.state_in_place)
  // or, in packages from before that, returned them after the outputs (aotc/export/call_structure.py).
  if (!state_.empty() && !manifest_.signature.state_in_place && outputs.size() >= n_outputs) {
    state_.assign(outputs.begin() + static_cast<std::ptrdiff_t>(n_outputs), outputs.end());
  }
  if (outputs.size() > n_outputs) outputs.resize(n_outputs);
  return outputs;
}

}  // namespace aotc
