// Reading manifest.json field by field, the way aotc_runtime/fields.py and manifest.py do: every
// field a runtime reads is checked for its type before use, and the first wrong one is named.
#include "aotc/manifest.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>
#include <ATen/Version.h>
#include <torch/headeronly/version.h>

#include "aotc/error.h"
#include "aotc/sha256.h"
#include "small_file.h"

#ifdef AOTC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <torch/cuda.h>
#endif

namespace fs = std::filesystem;
using nlohmann::json;

namespace aotc {
namespace {

const std::vector<std::string> kDtypes = {"float32", "float16", "bfloat16", "float64", "int64",
                                          "int32",   "int16",   "int8",     "uint8",   "bool"};

struct FieldError {
  std::string field, problem;
};

// A manifest's value for a one-line message: JSON with everything but printable ASCII escaped (a
// line break in a name must not split the error line), cut at 80 characters.
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', true, json::error_handler_t::replace);
  return text.size() <= 80 ? text : text.substr(0, 77) + "...";
}

bool plain(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
}

// A key or name as written when it is plain printable ASCII, else shown() (quoted and escaped).
std::string shown_name(const std::string& name) { return plain(name) ? name : shown(json(name)); }

// One JSON object being read; `where` is its path from the document's root.
class Fields {
 public:
  Fields(const json& data, std::string where) : data_(data), where_(std::move(where)) {
    if (!data_.is_object()) throw FieldError{where_.empty() ? "(document)" : where_, "is not an object"};
  }
  std::string path(const std::string& key) const {
    return where_.empty() ? shown_name(key) : where_ + "." + shown_name(key);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const { throw FieldError{path(key), problem}; }
  bool has(const std::string& key) const { return data_.contains(key); }
  const json& value(const std::string& key) const {
    if (!data_.contains(key)) fail(key, "is missing");
    return data_.at(key);
  }
  std::string text(const std::string& key) const {
    const json& v = value(key);
    if (!v.is_string()) fail(key, "is not a string");
    return v.get<std::string>();
  }
  std::string text_or(const std::string& key, const std::string& fallback) const {
    return has(key) ? text(key) : fallback;
  }
  std::string optional_text(const std::string& key) const {
    if (!has(key) || data_.at(key).is_null()) return "";
    if (!data_.at(key).is_string()) fail(key, "is not a string or null");
    return data_.at(key).get<std::string>();
  }
  std::string choice(const std::string& key, const std::vector<std::string>& options) const {
    const json& v = value(key);
    std::string given = v.is_string() ? v.get<std::string>() : "";
    if (!v.is_string() || std::find(options.begin(), options.end(), given) == options.end()) {
      std::string joined;
      for (const auto& o : options) joined += (joined.empty() ? "" : ", ") + o;
      bool as_is = v.is_string() && plain(given) && given.size() <= 80;
      fail(key, "is " + (as_is ? "'" + given + "'" : shown(v)) + ", not one of " + joined);
    }
    return given;
  }
  int64_t integer(const std::string& key) const {
    const json& v = value(key);
    if (!v.is_number_integer()) fail(key, "is not an integer");
    return v.get<int64_t>();
  }
  void number(const std::string& key) const {
    if (!value(key).is_number()) fail(key, "is not a number");
  }
  bool boolean(const std::string& key) const {
    const json& v = value(key);
    if (!v.is_boolean()) fail(key, "is not true or false");
    return v.get<bool>();
  }
  Fields object(const std::string& key) const { return Fields(value(key), path(key)); }
  const json& list(const std::string& key) const {
    const json& v = value(key);
    if (!v.is_array()) fail(key, "is not a list");
    return v;
  }
  const json& data() const { return data_; }

 private:
  const json& data_;
  std::string where_;
};

// The bounds of aotc_runtime/signature.py: sizes up to 2**31 - 1, inputs up to 2**32 elements at the example sizes.
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxExampleElements = int64_t{1} << 32;
constexpr size_t kMaxManifestBytes = 16u << 20;

bool is_size(const json& v) {
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMaxSize;
}

// An integer that get<int64_t>() returns unchanged (an unsigned one above 2**63 - 1 would wrap).
bool is_int64(const json& v) {
  return v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
}

// The value_range an integer input may have: what its dtype holds, with high + 1 (random inputs are
// drawn with randint(low, high + 1)) inside int64, as INT_RANGES in aotc_runtime/signature.py.
const std::map<std::string, std::pair<int64_t, int64_t>> kIntRanges = {
    {"int64", {INT64_MIN, INT64_MAX - 1}}, {"int32", {INT32_MIN, INT32_MAX}}, {"int16", {INT16_MIN, INT16_MAX}},
    {"int8", {INT8_MIN, INT8_MAX}},        {"uint8", {0, UINT8_MAX}}};

// Nesting deeper than any manifest, about where Python's json.loads stops (its recursion limit).
// dump() and the comparison with the model's contract recurse once per level: a list nested
// 100,000 deep was a stack overflow (SIGSEGV) instead of exit 7.
constexpr size_t kMaxDepth = 1000;

size_t depth_of(const json& root) {
  size_t deepest = 0;
  std::vector<std::pair<const json*, size_t>> stack{{&root, 1}};
  while (!stack.empty()) {
    auto [value, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    if (value->is_structured())
      for (const auto& child : *value) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

// A relative POSIX path that stays in the package: no absolute path, no `..`, no empty part.
bool inside_package(const std::string& rel) {
  if (rel.empty() || rel[0] == '/' || rel.find('\\') != std::string::npos) return false;
  std::stringstream parts(rel);
  std::string part;
  size_t count = 0;
  while (std::getline(parts, part, '/')) {
    ++count;
    if (part.empty() || part == "." || part == "..") return false;
  }
  return count > 0 && rel.back() != '/';
}

TensorSpec read_tensor(const Fields& f, bool is_input) {
  TensorSpec spec;
  spec.name = f.text("name");
  if (spec.name.empty()) f.fail("name", "is empty");
  spec.dtype = f.choice("dtype", kDtypes);
  const json& shape = f.value("shape");
  bool ok = shape.is_array();
  for (const auto& e : shape) ok = ok && (is_size(e) || (e.is_string() && !e.get<std::string>().empty()));
  if (!ok) f.fail("shape", "is not a list of sizes (integers 0 to 2**31-1) and dim names");
  for (const auto& e : shape) {
    ShapeEntry entry;
    if (e.is_string()) entry.name = e.get<std::string>();
    else entry.size = e.get<int64_t>();
    spec.shape.push_back(entry);
  }
  if (is_input) {
    if (f.has("value_range") && !f.data().at("value_range").is_null()) {
      const json& r = f.data().at("value_range");
      if (!r.is_array() || r.size() != 2 || !is_int64(r[0]) || !is_int64(r[1]))
        f.fail("value_range", "is not null or [low, high] integers");
      spec.value_range = std::make_pair(r[0].get<int64_t>(), r[1].get<int64_t>());
      // An inverted range, or high + 1 past the dtype (int64's: signed overflow), failed in randint.
      auto bounds = kIntRanges.find(spec.dtype);
      auto [low, high] = *spec.value_range;
      if (bounds != kIntRanges.end() && !(bounds->second.first <= low && low <= high && high <= bounds->second.second)) {
        f.fail("value_range", "is [" + std::to_string(low) + ", " + std::to_string(high) + "], not [low, high] with " +
                                  std::to_string(bounds->second.first) + " <= low <= high <= " +
                                  std::to_string(bounds->second.second));
      }
    }
    spec.keyword = f.has("keyword") ? f.boolean("keyword") : false;
  }
  return spec;
}

std::vector<TensorSpec> read_tensors(const Fields& f, const std::string& key, bool is_input, bool required) {
  std::vector<TensorSpec> specs;
  if (!required && !f.has(key)) return specs;
  const json& items = f.list(key);
  for (size_t i = 0; i < items.size(); ++i) {
    specs.push_back(read_tensor(Fields(items[i], f.path(key) + "[" + std::to_string(i) + "]"), is_input));
  }
  return specs;
}

Signature read_signature(const Fields& f) {
  Signature sig;
  sig.inputs = read_tensors(f, "inputs", true, true);
  sig.outputs = read_tensors(f, "outputs", false, true);
  if (f.has("dims")) {
    Fields dims = f.object("dims");
    for (const auto& [name, value] : dims.data().items()) {
      Fields d(value, dims.path(name));
      DimRange range{d.integer("min"), d.integer("max"), d.integer("example")};
      if (range.max > kMaxSize) {
        d.fail("max", "is " + std::to_string(range.max) + ", above the largest size a runtime accepts (" + std::to_string(kMaxSize) + ")");
      }
      if (!(0 <= range.min && range.min <= range.example && range.example <= range.max)) {
        dims.fail(name, "range is not min <= example <= max (" + std::to_string(range.min) + ", " +
                            std::to_string(range.example) + ", " + std::to_string(range.max) + ")");
      }
      sig.dims[name] = range;
    }
  }
  std::vector<std::string> unnamed;
  for (const auto& spec : sig.inputs)
    for (const auto& e : spec.shape)
      if (!e.is_static() && !sig.dims.count(e.name) &&
          std::find(unnamed.begin(), unnamed.end(), e.name) == unnamed.end())
        unnamed.push_back(e.name);
  if (!unnamed.empty()) {
    std::sort(unnamed.begin(), unnamed.end());
    std::string joined;
    for (const auto& n : unnamed) joined += (joined.empty() ? "" : ", ") + shown_name(n);
    f.fail("inputs", "name dims with no range in " + f.path("dims") + ": " + joined);
  }
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    // Each factor is at most 2**31 - 1: stop multiplying once past the bound, so nothing overflows.
    int64_t elements = 1;
    for (const auto& e : sig.inputs[i].shape) {
      int64_t size = e.is_static() ? e.size : sig.dims.at(e.name).example;
      elements = elements > kMaxExampleElements ? elements : elements * size;
    }
    if (elements > kMaxExampleElements) {
      f.fail("inputs[" + std::to_string(i) + "].shape",
             "declares " + std::to_string(elements) + " elements at the example sizes, above the runtime's bound of 2**32");
    }
  }
  if (f.has("output_structure")) sig.output_structure = f.choice("output_structure", {"tensor", "tuple", "list", "dict", ""});
  sig.state = read_tensors(f, "state", false, false);
  if (f.has("state_in_place")) sig.state_in_place = f.boolean("state_in_place");
  return sig;
}

// `generation` (optional): as aotc_runtime/manifest.py's Generation.read.
Generation read_generation(const Fields& f) {
  Generation g;
  for (const char* key : {"batch_size", "max_seq_len", "vocab_size"}) {
    if (f.integer(key) < 1) f.fail(key, "is not a positive integer");
  }
  g.batch_size = f.integer("batch_size");
  g.max_seq_len = f.integer("max_seq_len");
  g.vocab_size = f.integer("vocab_size");
  if (f.has("eos_token_ids")) {
    for (const auto& id : f.list("eos_token_ids")) {
      if (!id.is_number_integer()) f.fail("eos_token_ids", "is not a list of integers");
      g.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  if (f.has("pad_token_id") && !f.value("pad_token_id").is_null()) g.pad_token_id = f.integer("pad_token_id");
  g.tokenizer = f.optional_text("tokenizer");
  if (f.has("sliding_window") && !f.value("sliding_window").is_null()) g.sliding_window = f.integer("sliding_window");
  if (f.has("step_format") && !f.value("step_format").is_null()) g.step_format = f.integer("step_format");
  return g;
}

// `specializations` (optional): [{"dims": {NAME: SIZE}, "package": "specialized/B-8"}, ...].
std::vector<Specialization> read_specializations(const Fields& f, const Signature& sig) {
  std::vector<Specialization> entries;
  if (!f.has("specializations")) return entries;
  // A member would start from the initial state at every call and never hand it back to the
  // dynamic model; the builder refuses such packages, so one is not a package aotc built.
  if (!sig.state.empty()) f.fail("specializations", "is set on a package with state (signature.state), which is never specialized");
  const json& items = f.list("specializations");
  for (size_t i = 0; i < items.size(); ++i) {
    Fields entry(items[i], f.path("specializations") + "[" + std::to_string(i) + "]");
    Specialization spec;
    spec.package = entry.text("package");
    if (!inside_package(spec.package)) {
      entry.fail("package", "is " + shown(json(spec.package)) + ", which is not a plain path inside the package");
    }
    Fields dims = entry.object("dims");
    // No dims would match every call: the dynamic model would never run.
    if (dims.data().empty()) entry.fail("dims", "is empty");
    for (const auto& item : dims.data().items()) {
      auto range = sig.dims.find(item.key());
      if (range == sig.dims.end()) dims.fail(item.key(), "is not a dim of signature.dims");
      int64_t size = dims.integer(item.key());
      if (size < range->second.min || size > range->second.max) {
        dims.fail(item.key(), "is " + std::to_string(size) + ", outside the dim's range " + std::to_string(range->second.min) +
                                  ".." + std::to_string(range->second.max));
      }
      spec.dims[item.key()] = size;
    }
    entries.push_back(std::move(spec));
  }
  return entries;
}

Manifest read_fields(const json& data) {
  Fields f(data, "");
  Manifest m;
  m.format_version = static_cast<int>(f.integer("format_version"));
  m.aotc_version = f.text("aotc_version");
  m.created = f.text("created");
  Fields toolchain = f.object("toolchain");
  m.torch = toolchain.text("torch");
  m.platform = toolchain.text_or("platform", "");
  Fields device = f.object("device");
  m.device_type = device.choice("type", {"cpu", "cuda"});
  m.gpu_name = device.optional_text("gpu_name");
  m.compute_capability = device.optional_text("compute_capability");
  if (m.device_type == "cuda" && m.compute_capability.empty()) device.fail("compute_capability", "is missing for a cuda package");
  if (f.has("product_tiles")) m.tiles_tuned_on = f.object("product_tiles").text_or("tuned_on", "");
  m.mode = f.choice("mode", {"default", "reduce-overhead", "max-autotune"});
  m.precision = f.choice("precision", {"fp32", "tf32", "bf16", "fp16"});
  f.object("inductor_options");
  // Format 1 had no `runtime` (no CUDA graphs or TF32 then).
  if (m.format_version >= 2 || f.has("runtime")) {
    Fields runtime = f.object("runtime");
    m.cuda_graphs = runtime.boolean("cuda_graphs");
    m.tf32 = runtime.boolean("tf32");
    m.cudnn_benchmark = runtime.has("cudnn_benchmark") && runtime.boolean("cudnn_benchmark");
  }
  m.signature = read_signature(f.object("signature"));
  m.specializations = read_specializations(f, m.signature);
  if (f.has("generation") && !f.value("generation").is_null()) m.generation = read_generation(f.object("generation"));
  if (f.has("shared_weights") && !f.value("shared_weights").is_null()) {
    Fields shared = f.object("shared_weights");
    SharedWeights sw;
    sw.file = shared.text("file");
    for (const auto& program : shared.list("programs")) {
      if (!program.is_string()) shared.fail("programs", "is not a list of '.' and member folders");
      std::string name = program.get<std::string>();
      bool member = std::any_of(m.specializations.begin(), m.specializations.end(),
                                [&](const Specialization& s) { return s.package == name; });
      if (name != "." && !member) f.fail("shared_weights", "names a program that is neither '.' nor a member");
      sw.programs.push_back(name);
    }
    m.shared_weights = sw;
  }
  m.cpu_isa = device.optional_text("cpu_isa");
  if (device.has("cpu_features")) {
    const json& features = device.list("cpu_features");
    for (const auto& feature : features) {
      if (!feature.is_string()) device.fail("cpu_features", "is not a list of strings");
      m.cpu_features.push_back(feature.get<std::string>());
    }
  }
  m.aten_cpu_capability = device.optional_text("aten_cpu_capability");
  // The same fields, in the same shape, as model_contract in aotc_runtime/manifest.py.
  const json& source = data.contains("source") ? data.at("source") : json();
  // cudnn_benchmark is not part of it: it picks among cuDNN's algorithms for the same convolutions
  json runtime_settings = {{"cuda_graphs", m.cuda_graphs}, {"tf32", m.tf32}};
  m.contract = json{{"signature", data.at("signature")},
                    {"source_sha256", source.is_object() && source.contains("sha256") ? source.at("sha256") : json()},
                    {"mode", m.mode},
                    {"precision", m.precision},
                    {"device", m.device_type},
                    {"runtime", runtime_settings}}
                   .dump();
  Fields files = f.object("files");
  for (const auto& [rel, digest] : files.data().items()) {
    if (!digest.is_string()) f.fail("files", "is not an object of path -> sha256");
    if (!inside_package(rel)) f.fail("files", "names " + shown(json(rel)) + ", which is not a plain path inside the package");
    m.files.emplace_back(rel, digest.get<std::string>());
  }
  if (!files.data().contains(kModelFile)) f.fail("files", std::string("does not list ") + kModelFile);
  if (m.shared_weights && !files.data().contains(m.shared_weights->file)) {
    f.fail("shared_weights", "names " + m.shared_weights->file + ", which files does not list");
  }
  f.number("build_seconds");
  Fields check = f.object("numeric_check");
  m.finished = !(check.data().size() == 1 && check.data().contains("status") && check.data().at("status") == "pending");
  if (m.finished) {
    check.text("reference");
    check.list("cases");
    check.number("atol");
    check.number("rtol");
    check.list("outputs");
    check.boolean("passed");
  }
  return m;
}

constexpr const char* kHashField = "manifest_sha256";
const std::string kZeroHash(64, '0');

// The text with the hash field's value replaced (its last occurrence: the writer puts it last).
std::string with_hash(const std::string& text, const std::string& old_value, const std::string& new_value) {
  std::string marker = std::string("\"") + kHashField + "\": \"" + old_value + "\"";
  size_t at = text.rfind(marker);
  if (at == std::string::npos) return text;
  return text.substr(0, at) + "\"" + kHashField + "\": \"" + new_value + "\"" + text.substr(at + marker.size());
}

// A manifest edited after the build (format 3 on) is refused, as _check_manifest_hash does.
void check_manifest_hash(const fs::path& path, const std::string& text, const json& data) {
  if (data.at("format_version").get<int64_t>() < 3) return;
  const json recorded = data.contains(kHashField) ? data.at(kHashField) : json();
  if (!recorded.is_string() || recorded.get<std::string>().size() != 64) {
    throw package_error(path.string() + " has no valid " + kHashField + "; rebuild the package with `aotc build --force`");
  }
  std::string value = recorded.get<std::string>();
  std::string zeroed = with_hash(text, value, kZeroHash);
  std::string actual = sha256_hex(zeroed);
  if (zeroed == text || actual != value) {
    throw package_error(path.string() + " was modified after the build: its " + kHashField + " is " + value.substr(0, 12) +
                        "..., its content hashes to " + actual.substr(0, 12) + "...; rebuild the package with `aotc build --force`");
  }
}

using Difference = std::optional<std::tuple<std::string, json, json>>;

// The first place two JSON values differ, in the order of _first_difference in manifest.py.
Difference first_difference(const json& ours, const json& theirs, const std::string& where) {
  if (ours.is_object() && theirs.is_object()) {
    std::set<std::string> keys;
    for (const auto& item : ours.items()) keys.insert(item.key());
    for (const auto& item : theirs.items()) keys.insert(item.key());
    for (const auto& key : keys) {
      Difference found = first_difference(ours.contains(key) ? ours.at(key) : json(), theirs.contains(key) ? theirs.at(key) : json(),
                                          where.empty() ? shown_name(key) : where + "." + shown_name(key));
      if (found) return found;
    }
    return std::nullopt;
  }
  if (ours.is_array() && theirs.is_array() && ours.size() == theirs.size()) {
    for (size_t i = 0; i < ours.size(); ++i) {
      Difference found = first_difference(ours[i], theirs[i], where + "[" + std::to_string(i) + "]");
      if (found) return found;
    }
    return std::nullopt;
  }
  if (ours == theirs) return std::nullopt;  // numbers compare by value, as Python's 4 == 4.0
  return std::make_tuple(where, ours, theirs);
}

std::string short_text(const json& value) { return shown(value); }

constexpr const char* kCpuinfoEnv = "AOTC_CPUINFO";
constexpr const char* kProcCpuinfo = "/proc/cpuinfo";
constexpr size_t kMaxCpuinfoBytes = 16u << 20;  // a 512-core machine's /proc/cpuinfo is a few MB

// The flags of a cpuinfo file, or nullopt and why not, in the Python runtime's words
// (_read_cpu_flags in aotc_runtime/environment.py). Read without blocking: a FIFO in its place is refused.
std::optional<std::set<std::string>> cpu_flags(const std::string& path, std::string& problem) {
  SmallFile file = read_small_file(path, kMaxCpuinfoBytes);
  switch (file.status) {
    case SmallFile::Status::ok: break;
    case SmallFile::Status::not_regular: problem = "is not a regular file"; return std::nullopt;
    case SmallFile::Status::too_large: problem = "is larger than 16 MiB"; return std::nullopt;
    default: problem = std::string("cannot be read (") + std::strerror(file.error) + ")"; return std::nullopt;
  }
  std::stringstream lines(file.bytes);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::set<std::string> flags;
    std::stringstream words(line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1));
    for (std::string word; words >> word;) flags.insert(word);
    return flags;
  }
  problem = "has no flags line";
  return std::nullopt;
}

// Refuse a package compiled with extensions this CPU lacks (it would die with SIGILL). A cpuinfo
// file named by $AOTC_CPUINFO that cannot be used fails closed; no /proc/cpuinfo (not Linux) skips.
void check_cpu(const std::string& where, const Manifest& m) {
  if (m.cpu_features.empty()) return;
  const char* set = std::getenv(kCpuinfoEnv);
  std::string override_path = set ? set : "", problem;
  auto here = cpu_flags(override_path.empty() ? kProcCpuinfo : override_path, problem);
  if (!here && !override_path.empty()) {
    throw package_error(where + " lists the CPU features it was compiled for, which cannot be checked: $" + kCpuinfoEnv + " is " +
                        override_path + ", which " + problem + "; point " + kCpuinfoEnv +
                        " at a cpuinfo file, or unset it to read " + kProcCpuinfo);
  }
  if (!here) return;
  std::string missing;
  for (const auto& feature : m.cpu_features)
    if (!here->count(feature)) missing += (missing.empty() ? "" : ", ") + feature;
  if (!missing.empty()) {
    throw package_error(where + " was compiled for CPU features this CPU lacks: " + missing + " (--cpu-isa " + m.cpu_isa +
                        "); rebuild it with `aotc build --cpu-isa avx2` for any x86-64-v3 CPU, or on this machine");
  }
}

// torch's CPU int4 kernel lays its weights out per CPU capability, chosen when torch starts: tiles
// packed for another capability are read as wrong numbers, with no error (environment.py).
void check_cpu_layout(const std::string& where, const Manifest& m) {
  if (m.aten_cpu_capability.empty()) return;
  std::string here = at::get_cpu_capability();
  if (here != m.aten_cpu_capability) {
    throw package_error(where + " stores int4 weights in the layout of torch's " + m.aten_cpu_capability +
                        " CPU kernels, but torch here runs its " + here +
                        " kernels (this CPU, or $ATEN_CPU_CAPABILITY); rebuild it on a machine where torch runs " + here +
                        ", or run it where torch runs " + m.aten_cpu_capability);
  }
}

std::string torch_release(const std::string& version) { return version.substr(0, version.find('+')); }

std::string running_torch() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

std::string running_platform() {
  struct utsname name;
  uname(&name);
  std::string system = name.sysname;
  std::transform(system.begin(), system.end(), system.begin(), ::tolower);
  return system + "-" + name.machine;
}

// TEXT (FOLDER/manifest.json's bytes) parsed, with the checks every manifest must pass whatever its
// backend: JSON, nesting, format_version, manifest_sha256.
json parse_checked_json(const std::string& folder, const std::string& text) {
  fs::path path = fs::path(folder) / kManifestName;
  json data;
  try {
    // nlohmann's parser is iterative with a depth limit of its own, so deep nesting is an error, not a crash.
    data = json::parse(text);
  } catch (const json::exception& exc) {
    throw package_error(path.string() + " is not valid JSON (" + std::string(exc.what()).substr(0, 100) +
                        "); rebuild the package with `aotc build`");
  }
  if (depth_of(data) > kMaxDepth) {
    throw package_error(path.string() + " is not valid JSON (nested more than " + std::to_string(kMaxDepth) +
                        " levels deep); rebuild the package with `aotc build`");
  }
  if (!data.is_object() || !data.contains("format_version")) {
    throw package_error(path.string() + " is not an aotc manifest (no format_version); rebuild the package with `aotc build`");
  }
  const json& version = data.at("format_version");
  if (!version.is_number_integer() || version.get<int64_t>() < 1 || version.get<int64_t>() > kFormatVersion) {
    throw package_error(folder + " has package format " + shown(version) +
                        ", this runtime reads formats 1, 2, 3; rebuild the package with the aotc that matches this runtime");
  }
  check_manifest_hash(path, text, data);
  return data;
}

}  // namespace

std::string read_manifest_bytes(const std::string& folder) {
  fs::path dir(folder);
  if (!fs::is_directory(dir)) {
    std::string hint = fs::exists(dir) ? " (it is a file: pass the package folder that `aotc build` wrote)" : "";
    throw package_error("package folder " + folder + " does not exist" + hint + "; build one with `aotc build ARTIFACT.pt2 -o " +
                        folder + "`");
  }
  fs::path path = dir / kManifestName;
  SmallFile file = read_small_file(path.string(), kMaxManifestBytes);
  switch (file.status) {
    case SmallFile::Status::ok:
      return file.bytes;
    case SmallFile::Status::missing:
    case SmallFile::Status::not_regular:  // a FIFO or a folder in its place: never opened for reading
      throw package_error(folder + " is not an aotc package: it has no " + kManifestName + "; rebuild it with `aotc build`");
    case SmallFile::Status::too_large: {
      std::error_code ignored;
      throw package_error(path.string() + " is " + std::to_string(fs::file_size(path, ignored)) +
                          " bytes, above the 16 MiB a manifest may have; rebuild the package with `aotc build`");
    }
    case SmallFile::Status::unreadable:
      break;
  }
  throw package_error(path.string() + " cannot be read (" + std::strerror(file.error) + "); rebuild the package with `aotc build`");
}

std::string read_backend(const std::string& folder) {
  json data = parse_checked_json(folder, read_manifest_bytes(folder));
  const json& backend = data.contains("backend") ? data.at("backend") : json("aotinductor");
  return backend.is_string() ? backend.get<std::string>() : shown(backend);
}

Manifest read_manifest(const std::string& folder) { return parse_manifest(folder, read_manifest_bytes(folder)); }

Manifest parse_manifest(const std::string& folder, const std::string& text) {
  json data = parse_checked_json(folder, text);
  fs::path path = fs::path(folder) / kManifestName;
  if (data.contains("backend") && data.at("backend") != "aotinductor") {
    // ONNX Runtime packages: linking ONNX Runtime's C++ library would give this runner a second
    // native runtime beside libtorch; the Python runtime runs them.
    throw package_error("package " + folder + " runs on the " + shown(data.at("backend")) +
                        " backend; the C++ runner runs AOTInductor packages only: run it with `aotc run` or `aotc-run`");
  }
  try {
    return read_fields(data);
  } catch (const FieldError& err) {
    throw package_error(path.string() + " is not a valid manifest: " + err.field + " " + err.problem +
                        "; rebuild the package with `aotc build --force`");
  } catch (const json::exception& exc) {
    throw package_error(path.string() + " is not a valid manifest (" + std::string(exc.what()) +
                        "); rebuild the package with `aotc build --force`");
  }
}

void verify_files(const std::string& folder, const Manifest& manifest) {
  std::vector<std::string> problems;
  std::set<std::string> listed;
  for (const auto& [rel, digest] : manifest.files) {
    listed.insert(rel);
    fs::path path = fs::path(folder) / rel;
    // Never follow a link (out of the folder, or to /proc) and never read anything but a regular file.
    bool link = false;
    fs::path partial = folder;
    for (const auto& part : fs::path(rel)) link = link || fs::is_symlink(partial /= part);
    if (link) problems.push_back(rel + " is a symbolic link");
    else if (!fs::is_regular_file(fs::symlink_status(path))) problems.push_back(rel + " is missing");
    else if (sha256_file(path.string()) != digest) problems.push_back(rel + " was modified (sha256 differs from the manifest)");
  }
  std::vector<std::string> unlisted;
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    if (!entry.is_symlink() && entry.is_directory()) continue;  // files, links and anything else count
    std::string rel = fs::relative(entry.path(), folder).generic_string();
    if (rel != kManifestName && rel != kSignatureFile && !listed.count(rel)) unlisted.push_back(rel + " is not listed in the manifest");
  }
  std::sort(unlisted.begin(), unlisted.end());
  problems.insert(problems.end(), unlisted.begin(), unlisted.end());
  if (!problems.empty()) {
    std::string joined;
    for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    throw package_error("package " + folder + " is damaged: " + joined + "; rebuild it with `aotc build --force`");
  }
}

void check_compatible(const std::string& folder, const Manifest& m) {
  std::string where = "package " + folder;
  if (!m.finished) {
    throw package_error(where + " was never finished: its build stopped before the numeric check; rebuild it with `aotc build --force`");
  }
  if (torch_release(m.torch) != running_torch()) {
    throw package_error(where + " was built with torch " + m.torch + ", this process runs torch " + running_torch() +
                        "; rebuild it with `aotc build` on a machine with this torch, or run it where that torch is installed");
  }
  if (!m.platform.empty() && m.platform != running_platform()) {
    throw package_error(where + " was built for " + m.platform + ", this machine is " + running_platform() + "; rebuild it here");
  }
  check_cpu(where, m);
  check_cpu_layout(where, m);
}

std::string tuned_elsewhere(const Manifest& m, const std::string& here) {
  if (m.tiles_tuned_on.empty() || m.tiles_tuned_on == here) return "";
  return "its fused products' tiles were chosen on " + m.tiles_tuned_on + ", this GPU is " + here +
         ": it runs correctly, maybe slower than a build made here; rebuild it on this GPU for tiles of its own";
}

void check_device(const std::string& folder, const Manifest& m) {
  if (m.device_type != "cuda") return;
  std::string where = "package " + folder;
#ifdef AOTC_WITH_CUDA
  if (torch::cuda::is_available()) {
    const auto* props = at::cuda::getCurrentDeviceProperties();
    std::string here = std::to_string(props->major) + "." + std::to_string(props->minor);
    if (here != m.compute_capability) {
      throw package_error(where + " was built for " + m.gpu_name + " (compute capability " + m.compute_capability +
                          "), this GPU is " + props->name + " (" + here + "); rebuild it on this GPU's architecture");
    }
    std::string note = tuned_elsewhere(m, props->name);
    if (!note.empty()) std::cerr << "aotc-runner: " << where << ": " << note << "\n";  // once: a package loads once
    return;
  }
#endif
  throw package_error(where + " was built for CUDA (" + m.gpu_name +
                      "), but this machine has no usable GPU; build a CPU package with `aotc build --device cpu`");
}

void check_contract(const std::string& folder, const Manifest& manifest,
                    const std::unordered_map<std::string, std::string>& metadata) {
  auto embedded = metadata.find(kContractKey);
  if (embedded == metadata.end()) {
    if (manifest.format_version < 3) return;  // built before models carried one
    throw package_error("package " + folder + ": its " + kModelFile +
                        " carries no aotc description (it was replaced by a model aotc did not build for this manifest); "
                        "rebuild it with `aotc build --force`");
  }
  json model_side = json::parse(embedded->second, nullptr, /*allow_exceptions=*/false);
  if (model_side.is_discarded()) model_side = json();
  Difference found = first_difference(json::parse(manifest.contract), model_side, "");
  if (!found) return;
  const auto& [where, ours, theirs] = *found;
  throw package_error("package " + folder + ": manifest.json does not describe its compiled model: " +
                      (where.empty() ? "the description" : where) + " is " + short_text(ours) + " in the manifest but " +
                      short_text(theirs) + " in " + kModelFile + " (an edited manifest or a swapped model); rebuild it with `aotc build --force`");
}

}  // namespace aotc
