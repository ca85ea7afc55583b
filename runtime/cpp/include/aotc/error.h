// Errors of the C++ runtime: each carries the exit code of the table in README.md, the same as the
// Python runtime's (aotc_runtime.PackageError = 7, InputMismatchError = 8), and a one-line message.
#pragma once

#include <stdexcept>
#include <string>

namespace aotc {

class Error : public std::runtime_error {
 public:
  Error(int exit_code, const std::string& message) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

constexpr int kUsageExit = 2;    // bad command line or input file
constexpr int kModelExit = 3;    // the model fails on its inputs (its logits are not finite)
constexpr int kPackageExit = 7;  // package refused: not a package, damaged, built for another torch/GPU
constexpr int kInputExit = 8;    // run-time inputs do not match the package signature

inline Error package_error(const std::string& message) { return Error(kPackageExit, message); }
inline Error input_error(const std::string& message) { return Error(kInputExit, message); }
inline Error usage_error(const std::string& message) { return Error(kUsageExit, message); }
inline Error model_error(const std::string& message) { return Error(kModelExit, message); }

}  // namespace aotc
