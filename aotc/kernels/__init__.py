"""aotc's own GPU kernels, their launch-shape rules and their CPU references.

Each kernel is a Triton kernel registered as a `torch.library.triton_op`, which AOTInductor
compiles into the package, so the runtimes need nothing new. Each has a reference CI runs without
a GPU, and a marked GPU test (tests/test_gpu_*.py) holds the kernel to that reference:

- attention.py: split-K decode attention over aotc's KV cache (aotc::cached_attention on CUDA),
  and a tiled kernel for whole blocks of a joining prompt's chunk. Its launch rule, the rule that
  picks the tiled blocks and the split algorithm in plain PyTorch are split_attention.py, held to
  the unsplit attention (aotc/export/cached_attention.py) by tests/test_split_attention.py.
- gemv.py: the int8/fp8 weight product on CUDA (aotc::quantized_gemv_cuda). Its reference is the
  stored weight dequantized and multiplied (aotc/export/quantized_linear.py), the CPU's own
  product, tested by tests/test_quantize.py; tests/test_gpu_quantize.py holds the kernel to it.

- fused_gemv.py: a decode step's product with its RMSNorm or LayerNorm, its gated activation or
  gelu_new, and its residual add (aotc::fused_gemv_cuda, `aotc build --fused-products`), over
  float, int8, fp8 or int4 weights; its reference is aotc/export/fused_products.py's `reference`
  (tests/test_fused_products.py on the CPU, tests/test_gpu_fused_products.py on the GPU).
- product_tiles.py: the fused products' tiles a `--fused-products` build times on its GPU and
  records in the manifest (`product_tiles`); tests/test_product_tiles.py, and the candidates'
  kernels lowered by tests/test_kernel_frontend.py.
- tile_timing.py: the candidates of product_tiles.py run and timed on the GPU, each product in
  the form the step has it.
- graph_timing.py: GPU work timed as a decode step runs it (one CUDA graph, replayed), for the
  build's tile choice and the kernel benchmarks in scripts/.
- programmatic.py: the wait for the kernel before and the release of the kernel after that aotc's
  kernels carry on compute capability 9.0+, for `aotc build --pdl`
  (aotc/compiler/programmatic_launch.py); tests/test_programmatic_launch.py.

Importing attention.py or gemv.py needs Triton (CUDA builds); split_attention.py does not.
"""
