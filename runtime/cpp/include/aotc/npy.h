// NumPy files in and out: .npy (one array) and .npz (a zip of .npy entries), with no Python.
//
// Supported subset (docs/cpp-runner.md): little-endian or byte-order-free dtypes float16, float32,
// float64, int8, int16, int32, int64, uint8, bool; C or Fortran order; .npy format versions 1.0 to
// 3.0; .npz as numpy.savez (stored) and numpy.savez_compressed (deflated) write it, under 4 GiB (no
// zip64). Every number a file declares is checked before anything is allocated from it, and
// exactly the declared bytes are read (an entry's CRC-32 checked). Anything else (big-endian,
// object or structured dtypes, pickles, encrypted or zip64 archives) is refused with a one-line
// error, exit 8, never read. A package's input files: aotc/inputs.h (their headers checked against
// the signature before any data is read).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace aotc {

// One array from a .npy file, as a contiguous CPU tensor.
at::Tensor read_npy(const std::string& path);

// Every array of a .npz file, in the archive's order, by entry name (without ".npy").
std::vector<std::pair<std::string, at::Tensor>> read_npz(const std::string& path);

// Write tensors as an uncompressed .npz (numpy.load reads it); atomically (temp file, rename).
void write_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& arrays);

}  // namespace aotc
