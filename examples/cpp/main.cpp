// Your own program running an aotc package, with no Python: load, call, read the outputs.
//
//   cmake -S examples/cpp -B build/embed <the arguments `make runner` passes> && cmake --build build/embed
//   build/embed/embed mlp_pkg/
#include <aotc/package.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: embed PKG/\n";
    return 2;
  }
  try {
    aotc::Package package = aotc::Package::load(argv[1]);        // checks manifest, hashes, versions
    std::vector<at::Tensor> inputs = package.random_inputs(0);   // or your own tensors, in signature order
    std::vector<at::Tensor> outputs = package.run(inputs);       // checked against the signature first
    const auto& names = package.manifest().signature.outputs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::cout << names[i].name << " " << outputs[i].sizes() << " sum " << outputs[i].sum().item<double>() << "\n";
    }
  } catch (const aotc::Error& err) {  // a package or input the runtime refuses: one line, the documented exit code
    std::cerr << "error: " << err.what() << "\n";
    return err.exit_code();
  }
  return 0;
}
