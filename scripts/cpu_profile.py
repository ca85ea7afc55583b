"""CPU time per kind of kernel: Inductor's code for an artifact against ONNX Runtime's, per call.

Where the gap between an AOTInductor package and ONNX Runtime comes from on the CPU: Inductor's
kernels are profiled through torch.compile(mode="default") of the artifact (the same generated C++
an AOTInductor default build compiles, with Inductor's per-kernel profiling on), ONNX Runtime's
through its own profiler on the artifact's ONNX Runtime package; both on the same inputs, after a
warm-up, summed per call and grouped by kind (GEMM, attention, normalization, convolution, fused
elementwise, ...).

usage: python scripts/cpu_profile.py ARTIFACT.pt2 [--calls 20] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

# kind -> name fragments (lower case) of the ops that are that kind, in either runtime
KINDS = (
    ("attention", ("scaled_dot_product", "flash_attention", "attention", "softmax")),
    ("gemm", ("addmm", "bmm", "baddbmm", "aten::mm", "linear", "matmul", "gemm", "mkl")),
    ("normalization", ("layer_norm", "layernorm", "batch_norm", "batchnorm")),
    ("convolution", ("conv",)),
    ("inductor fused C++ kernels", ("cpp_fused",)),
    ("elementwise and data movement", ("add", "mul", "gelu", "erf", "where", "cast", "reshape",
                                       "transpose", "gather", "div", "sub", "tanh", "relu", "expand",
                                       "slice", "concat", "unsqueeze", "copy", "clone")),
)  # fmt: skip


def kind(name: str) -> str:
    lower = name.lower()
    return next((k for k, fragments in KINDS if any(f in lower for f in fragments)), "other")


def inductor_ms(artifact: Path, inputs, calls: int) -> dict:
    import torch
    from torch._inductor import config

    from aotc.export.artifact import load_artifact

    ep, _meta = load_artifact(artifact)
    config.cpp.enable_kernel_profile = True  # each generated kernel becomes a profiler event
    compiled = torch.compile(ep.module(), mode="default", dynamic=False)
    with torch.inference_mode():
        for _ in range(3):
            compiled(*inputs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                compiled(*inputs)
    per_op: dict = collections.defaultdict(float)
    for event in prof.key_averages():
        # self time: a parent (a compiled graph's call) would count its children again
        if event.self_cpu_time_total > 0:
            per_op[event.key] += event.self_cpu_time_total / 1e3 / calls
    return per_op


def onnxruntime_ms(artifact: Path, inputs, calls: int) -> dict:
    import onnxruntime

    from aotc.bench.contenders import onnxruntime_package

    with tempfile.TemporaryDirectory() as work:
        package = onnxruntime_package(artifact, Path(work))
        options = onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(work) / "ort")
        session = onnxruntime.InferenceSession(
            str(package / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in session.get_inputs()]
        feed = dict(zip(names, (t.numpy() for t in inputs)))
        warm = 3
        for _ in range(warm + calls):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    per_op: dict = collections.defaultdict(float)
    # the warm-up calls' events are left out: everything from the first timed call's start on
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    cutoff = runs[warm] if len(runs) > warm else 0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            if event["ts"] >= cutoff:
                per_op[event["args"].get("op_name", event["name"])] += event["dur"] / 1e3 / calls
    return per_op


def by_kind(per_op: dict) -> dict:
    kinds: dict = collections.defaultdict(float)
    for name, ms in per_op.items():
        kinds[kind(name)] += ms
    return {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from aotc.export.artifact import read_artifact_meta
    from aotc_runtime import Signature

    signature = Signature.from_json(read_artifact_meta(args.artifact).signature)
    inputs = signature.random_inputs(seed=0)
    result = {}
    for label, measure in (("inductor", inductor_ms), ("onnxruntime", onnxruntime_ms)):
        per_op = measure(args.artifact, inputs, args.calls)
        top = sorted(per_op.items(), key=lambda kv: -kv[1])[:12]
        result[label] = {
            "ms_per_call": round(sum(per_op.values()), 3),
            "by_kind_ms": by_kind(per_op),
            "top_ops_ms": [[round(ms, 3), name[:100]] for name, ms in top],
        }
        print(f"{label}: {result[label]['ms_per_call']:.2f} ms of op time per call")
        print(
            "  by kind: "
            + ", ".join(f"{k} {v:.2f}" for k, v in result[label]["by_kind_ms"].items())
        )
        for ms, name in result[label]["top_ops_ms"]:
            print(f"  {ms:8.3f}  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
