// The check of one input against the signature (dtype, rank, static sizes, dim ranges, dims that
// inputs share), with the Python runtime's messages (Signature.check_declared). One at a time and
// in any order: input files give their arrays' headers in file order, and each is checked before
// any data is read; Package::check_inputs runs it over a call's tensors in signature order.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "aotc/manifest.h"

namespace aotc {

class InputCheck {
 public:
  explicit InputCheck(const Signature& signature) : signature_(signature) {}
  // Throws aotc::Error (exit 8) naming input `index` when `dtype` (a signature dtype name such as
  // "float32", or numpy's name of another) and `sizes` do not fit it.
  void check(size_t index, at::IntArrayRef sizes, const std::string& dtype);

 private:
  const Signature& signature_;
  std::map<std::string, std::pair<int64_t, std::string>> bound_;  // dim -> (size, label of the first input that set it)
};

}  // namespace aotc
