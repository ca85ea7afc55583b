// Input files for a package (.npy, one input each; .npz, all of them), read the way aotc_runtime
// reads them: every array's header is checked against the signature (count, dtype, rank, sizes,
// ranges: Package::check_inputs, its messages and exit 8) before any array's data is read.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

namespace aotc {

class Package;

// The inputs in signature order, as contiguous CPU tensors.
std::vector<at::Tensor> read_inputs(const std::vector<std::string>& paths, const Package& package);

}  // namespace aotc
