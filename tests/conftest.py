"""Shared fixtures: each test package is exported and built once per test session, lazily."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aotc.cli.main import cli

MODELS = Path(__file__).parent / "models"
# The torch.compile tutorials' MLP is the demo model; the tests use the same file rather than a copy.
MLP = Path(__file__).parent.parent / "examples" / "mlp.py"

# name -> (model file, export flags). Built on first use, shared by every test that asks.
CASES = {
    "mlp": (MLP, ["--input-shape", "32x128"]),
    "feature_pyramid": ("feature_pyramid.py", ["--input-shape", "1x3x224x224"]),
    "sincos": ("sincos.py", ["--entry", "foo", "--input-shape", "10x10", "--input-shape", "10x10"]),
    "cnn_bn": ("cnn_bn.py", ["--input-shape", "16x3x128x128"]),
    "two_input": ("two_input.py", []),
    "dynamic_mlp": (MLP, ["--input-shape", "Bx128", "--dim", "B=1:64"]),
    "structured": ("structured_outputs.py", ["--dim", "B=1:8@ids:0,mask:0"]),
    "counter": ("counter.py", ["--input-shape", "2x3"]),
}


def invoke(*args):
    """Run the aotc CLI in-process; the result has exit_code, stdout, stderr.

    Every package a test builds through it is checked against docs/manifest.schema.json: the
    packages the tests build are the format's examples.
    """
    args = [str(a) for a in args]
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
    finally:  # a command's --threads (or its default) must not follow the session's later tests
        torch.set_num_threads(threads)
    if result.exit_code == 0 and args and args[0] == "build":
        assert_manifest_matches_schema(built_package(args))
    return result


# A child process of BuildAhead: the aotc commands given as JSON lists of arguments, one after
# another in one process (torch and transformers imported once for all of them).
_AHEAD_CHILD = """
import json, sys
from aotc.cli.main import cli
for args in json.loads(sys.argv[1]):
    try:
        code = cli.main(args, prog_name="aotc", standalone_mode=False)
    except SystemExit as exc:  # the commands end with their documented exit code
        code = exc.code
    if code:
        sys.exit(code)
"""


class BuildAhead:
    """Exports and builds run in child processes two at a time, ahead of the tests that load their
    packages. On the CI's 2 cores an in-process build leaves one core idle most of the time (its
    export and its C++ compile each run on one), so a module whose tests each need a package of
    their own (test_generate, test_zoo) submits them all at its start and each test waits for its
    own. The commands are the CLI's, as `invoke` runs them."""

    def __init__(self, workers: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="build-ahead")
        self._runs: dict = {}

    def submit(self, key, *commands: list) -> None:
        if key not in self._runs:
            self._runs[key] = self._pool.submit(self._run, [[str(a) for a in c] for c in commands])

    def close(self) -> None:
        """At the session's end: what no test waited for is not started (a run of a few tests)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submitted(self, key) -> bool:
        return key in self._runs

    def wait(self, key, package: Path) -> None:
        """Fails the test with the child's stderr if its commands failed."""
        done = self._runs[key].result()
        assert done.returncode == 0, done.stderr[-3000:]
        assert_manifest_matches_schema(package)

    @staticmethod
    def _run(commands: list):
        import json
        import subprocess
        import sys

        return subprocess.run(
            [sys.executable, "-c", _AHEAD_CHILD, json.dumps(commands)],
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip


def built_package(args: list) -> Path:
    """The package folder `aotc build ARGS` wrote: -o/--output, else the default beside the artifact."""
    from aotc.config import default_package_folder

    for flag in ("-o", "--output"):
        if flag in args:
            return Path(args[args.index(flag) + 1])
    return default_package_folder(Path(args[1]))


def assert_manifest_matches_schema(package: Path) -> None:
    import json

    problems = manifest_problems(json.loads((package / "manifest.json").read_text()))
    assert not problems, f"{package}/manifest.json breaks docs/manifest.schema.json: {problems[:5]}"


class Built:
    def __init__(self, name: str, artifact: Path, package: Path, model_file: Path):
        self.name, self.artifact, self.package, self.model_file = (
            name,
            artifact,
            package,
            model_file,
        )


class PackageCache:
    def __init__(self, root: Path):
        self.root = root
        self.built: dict[str, Built] = {}

    def get(self, name: str) -> Built:
        if name not in self.built:
            model, flags = CASES[name]
            artifact = self.root / f"{name}.pt2"
            package = self.root / f"{name}_pkg"
            result = invoke("export", MODELS / model, *flags, "-o", artifact)
            assert result.exit_code == 0, result.stderr
            result = invoke(
                "build", artifact, "--device", "cpu", "--mode", "default", "-o", package, "--quiet"
            )
            assert result.exit_code == 0, result.stderr
            self.built[name] = Built(name, artifact, package, MODELS / model)
        return self.built[name]


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> PackageCache:
    return PackageCache(tmp_path_factory.mktemp("packages"))


ZOO = Path(__file__).parent / "zoo"
# gpt2 and the llama line; then other architectures: fused projections (phi3, gpt_neox), multi-query
# attention, soft-capping and a sliding window shorter than the sequence (gemma2, gemma3), normed
# queries and keys (qwen3, gemma3), a layer without rotary embeddings (smollm3), parallel attention
# and MLP with LayerNorm (phi, gpt_neox, cohere, falcon), partial (phi, gpt_neox) or interleaved
# (cohere) rotary embeddings, a config that names its key/value heads its own way (falcon), a
# mixture of experts with a shared expert (qwen2_moe)
GENERATION_FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "phi3", "gemma2", "gemma3", "qwen3", "smollm3",
            "cohere", "phi", "gpt_neox", "falcon", "qwen2_moe")  # fmt: skip
GENERATION_MAX_LEN, GENERATION_BATCH = 32, 2
# A zoo LM with its weights scaled up: at the default init scale a random LM repeats one token,
# which would make a token-for-token comparison say little.
GENERATION_MODEL_FILE = """
import importlib.util
import torch

spec = importlib.util.spec_from_file_location("zoo_lm", {zoo_file!r})
zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zoo)


def get_model():
    model = zoo.get_model().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model
"""


def load_model_file(path: Path):
    """The model as `aotc export` constructs it (seed 0, then get_model())."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.get_model().eval()


class GenerationBuilds:
    """Text-generation packages of the zoo's decoder LMs (tests/zoo/<family>.py, weights scaled),
    exported for batch 2 and a 32-token cache and built on the CPU once per session, on first use:
    family -> (package folder, the same model in eager)."""

    def __init__(self, root: Path):
        self.root = root
        self.built: dict = {}
        self.ahead = BuildAhead()

    def __getitem__(self, family: str) -> tuple:
        if family not in self.built:
            self.built[family] = self._build(family, family)
        return self.built[family]

    def prefetch(self, families) -> None:
        """Export and build these families in child processes from now on (BuildAhead)."""
        for family in families:
            if family not in self.built:
                source, artifact, package = self._files(family, family)
                self.ahead.submit(family, *self._commands(source, artifact, package))

    def with_tokenizer(self) -> tuple:
        """GPT-2's package with tiny_tokenizer's word-level tokenizer in it: (package, model)."""
        if "tokenizer" not in self.built:
            folder = tiny_tokenizer(self.root / "tokenizer")
            self.built["tokenizer"] = self._build("gpt2", "gpt2_tok", "--tokenizer", folder)
        return self.built["tokenizer"]

    def _files(self, family: str, name: str) -> tuple:
        """(model file, artifact, package) of a build; the model file written if not yet."""
        source = self.root / f"{family}_lm.py"
        if not source.exists():
            source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / f"{family}.py")))
        return source, self.root / f"{name}.pt2", self.root / f"{name}_pkg"

    @staticmethod
    def _commands(source: Path, artifact: Path, package: Path, *export_flags) -> tuple:
        export = ["export", source, "--task", "text-generation", "--max-seq-len", GENERATION_MAX_LEN,
                  "--batch-size", GENERATION_BATCH, *export_flags, "-o", artifact]  # fmt: skip
        return export, ["build", artifact, "--device", "cpu", "-o", package, "--quiet"]

    def _build(self, family: str, name: str, *export_flags) -> tuple:
        source, artifact, package = self._files(family, name)
        if self.ahead.submitted(name):
            self.ahead.wait(name, package)
        else:
            for command in self._commands(source, artifact, package, *export_flags):
                done = invoke(*command)
                assert done.exit_code == 0, done.stderr
        return package, load_model_file(source)


def tiny_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer of 512 words made with the `tokenizers` library (nothing downloaded),
    saved as a transformers tokenizer folder holds it (tokenizer.json): word "w7" is id 7."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 512)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def generation_packages(tmp_path_factory) -> Iterator[GenerationBuilds]:
    builds = GenerationBuilds(tmp_path_factory.mktemp("generation"))
    yield builds
    builds.ahead.close()


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """Two ed25519 key pairs (aotc keygen's format): `mine` signs packages, `other` is somebody
    else's."""
    from types import SimpleNamespace

    import aotc_runtime

    folder = tmp_path_factory.mktemp("keys")
    pairs = {}
    for name in ("mine", "other"):
        private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
        aotc_runtime.generate_keypair(private, public)
        pairs[name] = SimpleNamespace(private=private, public=public)
    return SimpleNamespace(**pairs)


def tampered_copy(source: Path, target: Path, edit=None, files=None) -> Path:
    """A copy of a package with its manifest edited and re-hashed, as anyone can do to an
    unsigned package: `files(folder)` changes files first (their hashes are recomputed), then
    `edit(manifest)` changes the manifest."""
    import json
    import shutil

    import aotc_runtime

    shutil.copytree(source, target)
    if files is not None:
        files(target)
    manifest = json.loads((target / "manifest.json").read_text())
    if files is not None:
        manifest["files"] = aotc_runtime.hash_package_files(target)
    if edit is not None:
        edit(manifest)
    (target / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    return target


def eager_model(name: str):
    """The model of a case, built the way aotc loads it (same seed, eval mode)."""
    from aotc.export.loading import load_model

    model, flags = CASES[name]
    entry = flags[flags.index("--entry") + 1] if "--entry" in flags else None
    return load_model(str(MODELS / model), entry).module


MANIFEST_SCHEMA = Path(__file__).parent.parent / "docs" / "manifest.schema.json"


def manifest_problems(manifest: dict) -> list:
    """Where a manifest breaks docs/manifest.schema.json (the format's contract): one line per problem."""
    import json

    try:
        import jsonschema
    except ImportError:  # a GPU machine without the registry: docs/gpu.md says how to bring it
        pytest.fail(
            "jsonschema is not installed; the tests check every package against docs/manifest.schema.json: "
            "pip install jsonschema (offline: docs/gpu.md)"
        )
    validator = jsonschema.Draft202012Validator(json.loads(MANIFEST_SCHEMA.read_text()))
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu are skipped on machines without CUDA (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {{ eos_token }} "
    "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
)


def save_llama_folder(folder: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A tiny LlamaForCausalLM as save_pretrained writes it, with its tokenizer: weights scaled
    up (at the default init scale a random LM repeats one token, and a comparison says little)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], pad_token_id=0)
    model.to(dtype).save_pretrained(folder, max_shard_size="100KB")  # 5 shards
    words = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<eot>": 3, **{f"w{i}": i for i in range(4, 512)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="[UNK]", pad_token="[UNK]")  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder


# Each test file's time (setup, call and teardown of its tests), summed: what `--durations` gives
# per test, per file, so that the slowest files are the first place to look (docs/development.md).
_FILE_SECONDS: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    terminalreporter.section("slowest test files")
    for path, seconds in _FILE_SECONDS.most_common(15):
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f}s in all")


@functools.cache
def built_runner() -> Path:
    """The C++ runner (`make runner`'s build), built once per test session, whichever test asks
    first."""
    from aotc.deploy.cpp_runner import build_runner

    return build_runner()


@pytest.fixture(scope="session")
def runner() -> Path:
    return built_runner()


def free_port() -> int:
    """A TCP port nobody listens on now, on 127.0.0.1."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
