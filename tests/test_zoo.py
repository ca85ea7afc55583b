"""The model zoo on CPU: transformers models as users build them, returned as is, through
export -> build -> run, each compared with the eager model it came from.

tests/zoo/catalog.py lists the models (small configs, nothing downloaded) and their dynamic dims.
Each model is exported and built once (a module-scoped cache); the tests then load the package
through aotc_runtime, call it with the model's keyword inputs, and compare every named output with
eager's at the example sizes and, for dynamic models, at other sizes inside the declared ranges.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import torch
from conftest import BuildAhead, invoke

ZOO_DIR = Path(__file__).parent / "zoo"


def _catalog():
    """tests/zoo/catalog.py by path: tests/zoo on sys.path would shadow packages named like its models (t5, clip)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo_catalog", ZOO_DIR / "catalog.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


ZOO = _catalog().ZOO
BY_NAME = {model.name: model for model in ZOO}
# Left out of the CI suite: architectures another entry already covers there, so that the suite
# stays well under its 30 minutes on the 2-core VM (each entry is an export and a build, 15-35 s).
# scripts/zoo.py still runs every model for docs/models.md. roberta and bert_seqcls are BERT with
# another embedding or head; qwen2 and mistral are Llama's decoder with grouped-query attention and
# a sliding window, and qwen2_moe their mixture of experts, which tests/test_generate.py exports
# and generates with; whisper_encoder is whisper's encoder; bart is t5's shape of encoder-decoder;
# resnet is convnext's static CNN path.
COVERED_ELSEWHERE = {
    "roberta",
    "bert_seqcls",
    "qwen2",
    "qwen2_moe",
    "mistral",
    "whisper_encoder",
    "bart",
    "resnet",
}


class ZooBuilds:
    """Each zoo model exported and built once per session, on first use."""

    def __init__(self, root: Path):
        self.root = root
        self.built: dict = {}
        self.ahead = BuildAhead()

    def _commands(self, name: str) -> tuple:
        model = BY_NAME[name]
        artifact = self.root / f"{name}.pt2"
        dims = [flag for dim in model.dims for flag in ("--dim", dim)]
        # No -o: the package folder is named after the artifact, beside it (the design's command).
        build = ["build", artifact, "--device", "cpu", "--quiet", "--atol", model.atol]
        return ["export", ZOO_DIR / model.file, *dims, "-o", artifact], build

    def prefetch(self, names) -> None:
        """Export and build these models in child processes from now on (conftest's BuildAhead)."""
        from aotc.config import default_package_folder

        for name in names:
            if name not in self.built:
                artifact = self.root / f"{name}.pt2"
                package = default_package_folder(artifact)
                self.ahead.submit(name, package, [artifact], *self._commands(name))

    def get(self, name: str) -> Path:
        if name not in self.built:
            from aotc.config import default_package_folder

            export, build = self._commands(name)
            package = default_package_folder(self.root / f"{name}.pt2")
            if self.ahead.submitted(name):
                self.ahead.wait(name, package)
            else:
                for command in (export, build):
                    result = invoke(*command)
                    assert result.exit_code == 0, result.stderr
            self.built[name] = package
        return self.built[name]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Iterator[ZooBuilds]:
    builds = ZooBuilds(tmp_path_factory.mktemp("zoo"))
    yield builds
    builds.ahead.close()


CI_MODELS = [model.name for model in ZOO if model.name not in COVERED_ELSEWHERE]


@pytest.fixture(scope="module", autouse=True)
def build_ahead(request, zoo):
    """The models the selected tests load, built two at a time from the module's start."""
    wanted = set()
    for item in request.session.items:
        if "zoo" in getattr(item, "fixturenames", ()):
            callspec = getattr(item, "callspec", None)
            wanted.add(callspec.params["name"] if callspec else "bert")  # the others load bert
    zoo.prefetch(name for name in CI_MODELS if name in wanted)


def eager(model):
    """The model and its example keyword inputs, built the way aotc export builds them."""
    from aotc.export.loading import load_model

    loaded = load_model(str(ZOO_DIR / model.file))
    produced = loaded.example_inputs()
    return loaded.module, produced if isinstance(produced, dict) else {"input_0": produced}


def named_outputs(out) -> dict:
    from aotc.export.call_structure import flat_leaves, output_layout

    return dict(zip(output_layout(out).names, flat_leaves(out)))


def assert_matches_eager(package, module, inputs: dict, atol: float) -> None:
    with torch.no_grad():
        want = named_outputs(module(**inputs))
        got = package(**inputs)
    got = got if isinstance(got, dict) else {"output_0": got}
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], atol=atol, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
        )


def other_sizes(signature, pick: str) -> dict:
    """Random inputs with every dynamic dim at its min (or max), drawn from the signature's value ranges."""
    sizes = {
        name: max(2, info["min"]) if pick == "min" else info["max"]
        for name, info in signature.dims.items()
    }
    return dict(zip(signature.input_names, signature.random_inputs(seed=3, sizes=sizes)))


@pytest.mark.slow
@pytest.mark.parametrize("name", CI_MODELS)
def test_zoo_model_matches_eager(zoo, name):
    import aotc_runtime

    model = BY_NAME[name]
    package = aotc_runtime.load(zoo.get(name))
    module, inputs = eager(model)
    assert_matches_eager(package, module, inputs, model.atol)
    if package.signature.dims:
        for pick in ("min", "max"):
            assert_matches_eager(package, module, other_sizes(package.signature, pick), model.atol)


@pytest.mark.slow
def test_zoo_run_writes_outputs_by_name(zoo, tmp_path):
    """`aotc run PKG/` with no flags but --output: random inputs from the signature, outputs under their names."""
    package = zoo.get("bert")
    result = invoke("run", f"{package}/", "--output", tmp_path / "out.npz", "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((package / "manifest.json").read_text())
    assert numpy.load(tmp_path / "out.npz").files == ["last_hidden_state", "pooler_output"]
    ids = next(spec for spec in manifest["signature"]["inputs"] if spec["name"] == "input_ids")
    # the embedding's rows, not the example's range
    assert ids["keyword"] and ids["value_range"] == [
        0,
        999,
    ]


@pytest.mark.slow
def test_zoo_artifact_and_package_load_without_transformers(zoo, tmp_path):
    """Nothing in the artifact or the package names a transformers class: a fresh process that
    cannot import transformers still loads and runs them."""
    import subprocess

    package = zoo.get("bert")
    script = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of transformers now fails
        "import torch, aotc_runtime\n"
        f"ep = torch.export.load({str(package.parent / 'bert.pt2')!r})\n"
        f"pkg = aotc_runtime.load({str(package)!r})\n"
        "out = pkg(**dict(zip(pkg.signature.input_names, pkg.signature.random_inputs())))\n"
        "print(sorted(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['last_hidden_state', 'pooler_output']"


def test_dim_range_past_the_position_embeddings_names_the_range_that_works(tmp_path):
    """GPT-2 with 64 positions exports fine for S up to 128 (no shape guard covers an index), then
    fails at run time: export runs the edges of each range and names the largest S that works."""
    result = invoke(
        "export",
        ZOO_DIR / "gpt2.py",
        "--dim",
        "B=1:8@input_ids:0,attention_mask:0",
        "--dim",
        "S=2:128@input_ids:1,attention_mask:1",
        "-o",
        tmp_path / "g.pt2",
    )
    assert result.exit_code == 2, result.stderr
    assert "the model fails with S=128, the max of --dim S (IndexError" in result.stderr
    assert "it runs up to S=64: --dim S=2:64@input_ids:1,attention_mask:1" in result.stderr
    assert not (tmp_path / "g.pt2").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_zoo_model_on_cuda_reduce_overhead(tmp_path, name):
    """The design's commands on the GPU: no --device (auto -> cuda), reduce-overhead (CUDA-graph replay)."""
    import aotc_runtime

    model = BY_NAME[name]
    dims = [flag for dim in model.dims for flag in ("--dim", dim)]
    result = invoke("export", ZOO_DIR / model.file, *dims, "-o", tmp_path / f"{name}.pt2")
    assert result.exit_code == 0, result.stderr
    result = invoke("build", tmp_path / f"{name}.pt2", "--mode", "reduce-overhead", "--quiet")
    assert result.exit_code == 0, result.stderr
    package = aotc_runtime.load(tmp_path / f"{name}_pkg")
    assert (package.manifest.device.type, package.manifest.device.requested) == ("cuda", "auto")
    module, inputs = eager(model)
    module = module.cuda()
    inputs = {k: v.cuda() for k, v in inputs.items()}
    from aotc.math_mode import strict_fp32

    with strict_fp32():
        for _call in range(3):  # capture, then replays
            assert_matches_eager(package, module, inputs, 1e-3)


def test_dim_range_torch_refuses_gives_dim_flags_only(tmp_path):
    """BERT slices its position ids, so torch.export itself bounds S by the 64 positions: the error
    gives the --dim flags that work, with their @ axes, and no --input-shape (the model has examples)."""
    result = invoke(
        "export",
        ZOO_DIR / "bert.py",
        "--dim",
        "S=2:128@input_ids:1,attention_mask:1,token_type_ids:1",
        "-o",
        tmp_path / "b.pt2",
    )
    assert result.exit_code == 4, result.stderr
    assert "(flags: --dim S=2:64@input_ids:1,attention_mask:1,token_type_ids:1)" in result.stderr
    assert "--input-shape" not in result.stderr and not (tmp_path / "b.pt2").exists()
