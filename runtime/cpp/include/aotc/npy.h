// NumPy files in and out: .npy (one array) and .npz (a zip of .npy entries), with no Python.
//
// Supported subset (docs/cpp-runner.md): little-endian or byte-order-free dtypes float16, float32,
// float64, int8, int16, int32, int64, uint8, bool; C or Fortran order; .npy format versions 1-3;
// .npz written by numpy.savez (stored entries; numpy.savez_compressed's deflated entries are
// refused with a message). Anything else (big-endian, object or structured dtypes, pickles) is
// refused with a one-line error, exit 2, never read.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace aotc {

// One array from a .npy file, as a contiguous CPU tensor.
at::Tensor read_npy(const std::string& path);

// The arrays of a .npz file, in the archive's order, by entry name (without ".npy").
std::vector<std::pair<std::string, at::Tensor>> read_npz(const std::string& path);

// Write tensors as an uncompressed .npz (numpy.load reads it); atomically (temp file, rename).
void write_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& arrays);

}  // namespace aotc
