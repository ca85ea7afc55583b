#include "input_check.h"

#include "aotc/error.h"

namespace aotc {
namespace {

// Python's repr of a list of ints: "[65, 128]".
std::string list_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::string describe(const TensorSpec& spec, const std::map<std::string, DimRange>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < spec.shape.size(); ++i) {
    const ShapeEntry& e = spec.shape[i];
    out += i ? ", " : "";
    if (e.is_static()) out += std::to_string(e.size);
    else if (dims.count(e.name)) out += e.name + "=" + std::to_string(dims.at(e.name).min) + ".." + std::to_string(dims.at(e.name).max);
    else out += e.name;
  }
  return out + "]";
}

}  // namespace

void InputCheck::check(size_t index, at::IntArrayRef sizes, const std::string& dtype) {
  const TensorSpec& spec = signature_.inputs.at(index);
  std::string label = "input '" + spec.name + "' (#" + std::to_string(index) + ")";
  std::string given = list_text(sizes), expected = describe(spec, signature_.dims);
  if (dtype != spec.dtype) {
    throw input_error(label + " must be " + spec.dtype + ", got " + dtype + " (shape " + given + "); convert it or re-export with --dtype " +
                      dtype);
  }
  if (sizes.size() != spec.shape.size()) {
    throw input_error(label + " must have " + std::to_string(spec.shape.size()) + " dims " + expected + ", got " +
                      std::to_string(sizes.size()) + " dims " + given);
  }
  for (size_t axis = 0; axis < spec.shape.size(); ++axis) {
    const ShapeEntry& want = spec.shape[axis];
    int64_t have = sizes[axis];
    if (want.is_static()) {
      if (want.size != have) {
        throw input_error(label + " must have shape " + expected + ", got " + given + ": dim " + std::to_string(axis) + " is static " +
                          std::to_string(want.size) + "; re-export with a named dim (--dim) to make it dynamic");
      }
      continue;
    }
    const DimRange& range = signature_.dims.at(want.name);
    if (have < range.min || have > range.max) {
      throw input_error(label + " must have shape " + expected + ", got " + given + ": dim " + std::to_string(axis) + " (" + want.name +
                        ") = " + std::to_string(have) + " is outside " + std::to_string(range.min) + ".." + std::to_string(range.max) +
                        "; re-export with a wider --dim " + want.name + "=MIN:MAX");
    }
    auto seen = bound_.find(want.name);
    if (seen != bound_.end() && seen->second.first != have) {
      throw input_error(label + " has " + want.name + " = " + std::to_string(have) + " but " + seen->second.second + " has " + want.name +
                        " = " + std::to_string(seen->second.first) + "; inputs sharing a dim name must agree");
    }
    bound_.emplace(want.name, std::make_pair(have, label));
  }
}

}  // namespace aotc
