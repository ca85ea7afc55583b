// Your own program running an aotc package, with no Python: load, call, read the outputs; or, for a
// text-generation package, generate with a callback that sees each step's new tokens as they come.
//
//   cmake -S examples/cpp -B build/embed <the arguments `make runner` passes> && cmake --build build/embed
//   build/embed/embed mlp_pkg/
//   build/embed/embed lm_pkg/ 5,17,42        # prompt token ids: prints each new token, then all of them
#include <ATen/ATen.h>
#include <aotc/package.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

int generate(aotc::Package& package, const std::string& prompt) {
  std::vector<int64_t> ids;
  std::stringstream parts(prompt);
  for (std::string part; std::getline(parts, part, ',');) ids.push_back(std::stoll(part));
  at::Tensor input_ids = at::tensor(ids, at::kLong).unsqueeze(0);  // one prompt [1, S]; a batch is [P, S]
  aotc::GenerationRequest request;
  request.max_new_tokens = 8;  // greedy; request.sampling sets temperature, top_k, top_p, seed
  auto generated = package.generate(input_ids, /*attention_mask=*/{}, request, [](const std::vector<int64_t>& tokens) {
    std::cout << "token " << tokens[0] << "\n";  // one per prompt, as each step makes them
  });
  std::cout << "generated";
  for (int64_t token : generated[0]) std::cout << " " << token;
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::cerr << "usage: embed PKG/ [PROMPT_IDS]\n";
    return 2;
  }
  try {
    aotc::Package package = aotc::Package::load(argv[1]);  // checks manifest, hashes, versions
    if (package.manifest().generation) return generate(package, argc == 3 ? argv[2] : "1,2,3");
    std::vector<at::Tensor> inputs = package.random_inputs(0);  // or your own tensors, in signature order
    std::vector<at::Tensor> outputs = package.run(inputs);      // checked against the signature first
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
