// A package's input files, with the rules of aotc_runtime.read_inputs (tensor_io.py, npz.py): each
// file fills inputs no earlier file filled. An .npy fills the next one; an .npz fills those its
// entries name (any order), or the next ones in order when its entries are arr_0, arr_1, ...
// (numpy.savez's names for arrays given by position); the last (or only) file must fill every
// input left. Together the files give every input once. Each array's header is checked against the
// signature as it is met, and only once every file has passed is any array's data read.
#include "aotc/inputs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>
#include <set>

#include "aotc/package.h"
#include "input_check.h"
#include "npy_format.h"

namespace aotc {
namespace {

std::string joined(const std::vector<std::string>& items, const std::string& suffix = "") {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item + suffix;
  return out;
}

// The inputs not filled yet, and what messages call them.
class Slots {
 public:
  explicit Slots(const Signature& signature) : signature_(signature) {
    for (size_t i = 0; i < signature.inputs.size(); ++i) open_.push_back(i);
  }
  const std::vector<size_t>& open() const { return open_; }
  std::vector<std::string> names(const std::vector<size_t>& indices) const {
    std::vector<std::string> out;
    for (size_t i : indices) out.push_back(signature_.inputs[i].name);
    return out;
  }
  // "the package takes input(s) a, b", or which are left once earlier files gave some.
  std::string expected() const {
    std::string left = joined(names(open_));
    if (open_.size() == signature_.inputs.size()) return "the package takes input(s) " + left;
    return "the inputs left after the earlier --input files are " + (left.empty() ? "none" : left);
  }
  void fill(size_t index) { open_.erase(std::find(open_.begin(), open_.end(), index)); }

 private:
  const Signature& signature_;
  std::vector<size_t> open_;
};

// The input each entry name fills (npz.py's match_names), or an empty result when none fits.
std::optional<std::vector<size_t>> match_names(const std::vector<std::string>& names, const Slots& slots, bool complete) {
  const std::vector<size_t>& open = slots.open();
  std::vector<std::string> open_names = slots.names(open);
  std::set<std::string> given(names.begin(), names.end()), wanted(open_names.begin(), open_names.end());
  bool subset = std::includes(wanted.begin(), wanted.end(), given.begin(), given.end());
  if (subset && (!complete || given == wanted)) {
    std::vector<size_t> targets;
    for (const auto& name : names) targets.push_back(open[std::find(open_names.begin(), open_names.end(), name) - open_names.begin()]);
    return targets;
  }
  std::set<std::string> positional;
  for (size_t i = 0; i < (complete ? open.size() : names.size()); ++i) positional.insert("arr_" + std::to_string(i));
  if (names.size() <= open.size() && given == positional) {
    std::vector<size_t> targets;
    for (const auto& name : names) targets.push_back(open[std::stoul(name.substr(4))]);
    return targets;
  }
  return std::nullopt;
}

struct Given {
  size_t index;
  StoredArray array;
};

void read_npz_file(const std::string& path, bool complete, Slots& slots, InputCheck& check, std::vector<Given>& given) {
  std::string label = "input file " + path;
  ZipDirectory zip = read_zip_directory(path, label, slots.open().size(), slots.expected());
  std::vector<std::string> names;
  for (const auto& e : zip.entries) {
    if (e.name.size() < 4 || e.name.compare(e.name.size() - 4, 4, ".npy") != 0) {
      throw input_error(label + " holds entry " + shown_text(e.name) + ", not an .npy array; save arrays with numpy.savez");
    }
    std::string name = e.name.substr(0, e.name.size() - 4);
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      throw input_error(label + " holds entry " + shown_text(e.name) + " twice; save each input once");
    }
    names.push_back(name);
  }
  auto targets = match_names(names, slots, complete);
  if (!targets) {
    std::vector<std::string> wanted = slots.names(slots.open()), shown, positional;
    for (const auto& name : names) shown.push_back(shown_text(name));
    for (size_t i = 0; i < wanted.size(); ++i) positional.push_back("arr_" + std::to_string(i));
    throw input_error(label + " holds entries " + (shown.empty() ? "none" : joined(shown)) + "; " + slots.expected() +
                      ": name each entry after its input (numpy.savez(path, " + joined(wanted, "=...") +
                      ")), or save them in order as " + joined(positional));
  }
  for (size_t i = 0; i < zip.entries.size(); ++i) {
    const ZipEntry& e = zip.entries[i];
    StoredArray array = open_entry(zip, e, label + " entry " + shown_text(e.name), label);
    check_plain_dtype(array.header, array.where);
    check.check((*targets)[i], array.header.shape, array.header.dtype);
    check_entry_size(array, e);
    given.push_back({(*targets)[i], std::move(array)});
  }
  for (size_t index : *targets) slots.fill(index);
}

}  // namespace

std::vector<at::Tensor> read_inputs(const std::vector<std::string>& paths, const Package& package) {
  const Signature& signature = package.manifest().signature;
  Slots slots(signature);
  InputCheck check(signature);
  std::vector<Given> given;
  for (size_t number = 0; number < paths.size(); ++number) {
    const std::string& path = paths[number];
    if (!std::filesystem::is_regular_file(path)) {
      throw input_error("input file " + path + " does not exist; pass .npy or .npz files with --input");
    }
    std::string name = std::filesystem::path(path).filename().string();
    size_t dot = name.find_last_of('.');
    std::string suffix = dot == std::string::npos || dot == 0 ? "" : name.substr(dot);
    std::string lower = suffix;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == ".npy") {
      if (slots.open().empty()) {
        throw input_error("input file " + path + " holds 1 array(s) but " + slots.expected() + "; pass one array per input");
      }
      size_t index = slots.open().front();
      StoredArray array = open_npy_file(path);
      check_plain_dtype(array.header, array.where);
      check.check(index, array.header.shape, array.header.dtype);
      check_npy_size(array);
      given.push_back({index, std::move(array)});
      slots.fill(index);
    } else if (lower == ".npz") {
      read_npz_file(path, number + 1 == paths.size(), slots, check, given);
    } else {
      throw input_error("input file " + path + " has an unknown type '" + suffix + "'; use .npy or .npz");
    }
  }
  if (!slots.open().empty()) {
    std::vector<std::string> all;
    for (const auto& spec : signature.inputs) all.push_back(spec.name);
    throw input_error("input(s) " + joined(slots.names(slots.open())) + " not given by the --input files; the package takes " + joined(all));
  }
  // Every header has passed: now the data, exactly the declared bytes of each.
  std::vector<at::Tensor> tensors(signature.inputs.size());
  for (const auto& item : given) tensors[item.index] = item.array.read();
  return tensors;
}

}  // namespace aotc
