"""ONNX: export artifacts to ONNX (aotc export --format onnx) and build ONNX Runtime packages
(aotc build --backend onnxruntime). onnx, onnxscript and onnxruntime are the `aotc[onnx]` extra."""
