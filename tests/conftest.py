"""Shared fixtures: each test package is exported and built once per test session, lazily."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import shared_store
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


def error_lines(stderr: str) -> list[str]:
    """stderr's lines without export's and build's progress lines (each starts "[aotc "): what a
    refusal says, which is one line."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("[aotc ")]


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


# A child process of BuildAhead: jobs read from stdin, one JSON line each ({"commands": [aotc
# arguments, ...], "log": path}), run one after another in this one process (torch and transformers
# imported once for all of them); each job's stdout and stderr go to its log, and its exit code to
# the parent on the process's first stdout, one JSON line per job.
_AHEAD_CHILD = """
import json, os, sys, traceback
from aotc.cli.main import cli
answers = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    job = json.loads(line)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log, 1), os.dup2(log, 2), os.close(log)
    code = 0
    for args in job["commands"]:
        try:
            code = cli.main(args, prog_name="aotc", standalone_mode=False) or 0
        except SystemExit as exc:  # the commands end with their documented exit code
            code = exc.code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
        if code:
            break
    sys.stdout.flush(), sys.stderr.flush()
    answers.write(json.dumps({"code": code}) + "\\n")
    answers.flush()
"""


class BuildAhead:
    """Exports and builds run in child processes, ahead of the tests that load their packages. On
    the CI's 2 cores an in-process build leaves one core idle most of the time (its export and its
    C++ compile each run on one), so a module whose tests each need a package of their own
    (test_generate, test_zoo) submits them all at its start and each test waits for its own. Two run
    at a time in a run without pytest-xdist workers, one per worker with them (the other worker is
    the other core's work). Each runs in a child process kept for JOBS_PER_CHILD jobs, which saves
    importing torch, transformers and Inductor again for each (6 s and more). The commands are the
    CLI's, as `invoke` runs them; each package is made once per run (shared_store), whichever worker
    asks first."""

    # Then a new child, so that what builds leave in memory does not pile up: it grows slowly (a
    # child that built test_generate's 14 LMs went from 522 to 601 MB), and each new child costs
    # 4 to 8 s (imports, and its first export and build warming up), so one module's builds
    # share one.
    JOBS_PER_CHILD = 20
    TIMEOUT_S = 1200

    def __init__(self, workers: int | None = None):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        workers = workers or (1 if shared_store.worker() else 2)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="build-ahead")
        self._runs: dict = {}
        self._local = threading.local()  # each pool thread's child: (process, jobs run)
        self._children: list = []

    def submit(self, key, package: Path, outputs: list, *commands: list) -> None:
        if key not in self._runs:
            commands_text = [[str(a) for a in c] for c in commands]
            log = Path(str(package) + ".log")
            self._runs[key] = self._pool.submit(
                shared_store.once, package, lambda: self._run(commands_text, log), outputs
            )

    def close(self) -> None:
        """At the session's end: what no test waited for is not started (a run of a few tests)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for child in self._children:
            child.stdin.close()
            child.wait(timeout=60)

    def submitted(self, key) -> bool:
        return key in self._runs

    def wait(self, key, package: Path) -> None:
        """Fails the test with the child's output if its commands failed."""
        self._runs[key].result()
        assert_manifest_matches_schema(package)

    def _run(self, commands: list, log: Path) -> None:
        import json
        import select

        child = self._child()
        child.stdin.write(json.dumps({"commands": commands, "log": str(log)}) + "\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], self.TIMEOUT_S)
        answer = child.stdout.readline() if ready else ""
        self._local.jobs += 1
        if not answer:  # it ended or hung: the next job gets a new child
            child.kill()
            self._local.process = None
        text = log.read_text(errors="replace") if log.exists() else ""
        code = json.loads(answer)["code"] if answer else f"none in {self.TIMEOUT_S} s or it ended"
        assert code == 0, f"exit code {code}: {text[-3000:]}"

    def _child(self):
        import subprocess
        import sys

        local = self._local
        if getattr(local, "process", None) is None or local.jobs >= self.JOBS_PER_CHILD:
            if getattr(local, "process", None) is not None:
                local.process.stdin.close()
                local.process.wait(timeout=60)
            local.process = subprocess.Popen(
                [sys.executable, "-c", _AHEAD_CHILD],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            local.jobs = 0
            self._children.append(local.process)
        return local.process


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
    """The CASES' packages, each exported and built once per test run (shared_store): by the first
    test that asks, in whichever pytest-xdist worker runs it."""

    BUILD_FLAGS = ("--device", "cpu", "--mode", "default")

    def __init__(self, root: Path):
        self.root = root

    def get(self, name: str) -> Built:
        model, flags = CASES[name]
        label = f"{name}-{shared_store.key(MODELS / model, *flags, *self.BUILD_FLAGS)}"
        artifact, package = self.root / f"{label}.pt2", self.root / f"{label}_pkg"

        def make() -> None:
            result = invoke("export", MODELS / model, *flags, "-o", artifact)
            assert result.exit_code == 0, result.stderr
            result = invoke("build", artifact, *self.BUILD_FLAGS, "-o", package, "--quiet")
            assert result.exit_code == 0, result.stderr

        shared_store.once(package, make, outputs=[artifact])
        return Built(name, artifact, package, MODELS / model)


@pytest.fixture(scope="session")
def store_root(tmp_path_factory) -> Iterator[Path]:
    """The folder of this run's shared packages (shared_store). At the session's end, a test that
    changed one of them fails the run."""
    root = shared_store.run_root(tmp_path_factory.getbasetemp()) / "store"
    root.mkdir(exist_ok=True)
    yield root
    changed = shared_store.check_unchanged(root)
    assert not changed, "; ".join(changed)


@pytest.fixture(scope="session")
def packages(store_root) -> PackageCache:
    return PackageCache(store_root)


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
    exported for batch 2 and a 32-token cache and built on the CPU once per run (shared_store), on
    first use: family -> (package folder, the same model in eager)."""

    def __init__(self, root: Path):
        self.root = root
        self.ahead = BuildAhead()
        self.built: dict = {}

    def __getitem__(self, family: str) -> tuple:
        if family not in self.built:
            self.built[family] = self._build(family, family)
        return self.built[family]

    def artifact(self, family: str) -> Path:
        """The family's export artifact (its package built too)."""
        self[family]
        return self._files(family, family)[1]

    def model_file(self, family: str) -> Path:
        """The family's model file, as `aotc export` takes it (nothing built)."""
        return self._files(family, family)[0]

    def prefetch(self, families) -> None:
        """Export and build these families in child processes from now on (BuildAhead)."""
        for family in families:
            source, artifact, package = self._files(family, family)
            self.ahead.submit(
                family, package, [artifact], *self._commands(source, artifact, package)
            )

    def with_tokenizer(self) -> tuple:
        """GPT-2's package with tiny_tokenizer's word-level tokenizer in it: (package, model)."""
        if "tokenizer" not in self.built:
            folder = shared_tiny_tokenizer(self.root.parent)
            self.built["tokenizer"] = self._build("gpt2", "gpt2_tok", "--tokenizer", folder)
        return self.built["tokenizer"]

    def with_json_tokenizer(self) -> tuple:
        """A tiny Llama's package (tests/long_context_lm.py) with json_tokenizer's byte-level BPE
        (tests/json_tokenizer.py) and a cache of 1,024 positions (room for a tools prompt and a
        JSON answer): (package, model)."""
        if "json" not in self.built:
            folder = self.root.parent / "json_tokenizer"

            def save() -> None:
                from json_tokenizer import json_tokenizer

                folder.mkdir(parents=True, exist_ok=True)
                json_tokenizer().save(str(folder / "tokenizer.json"))

            shared_store.once(folder, save)
            flags = ("--tokenizer", folder, "--max-seq-len", "1024")
            source = Path(__file__).parent / "long_context_lm.py"
            self.built["json"] = self._build("llama", "llama_json", *flags, source=source)
        return self.built["json"]

    def four_rows(self, family: str) -> tuple:
        """The family exported for a batch of 4, whose step runs for any first R rows (a batch of
        2 keeps a static step): (package, model)."""
        name = f"{family}_b4"
        if name not in self.built:
            self.built[name] = self._build(family, name, "--batch-size", "4")
        return self.built[name]

    def _files(self, family: str, name: str, *export_flags) -> tuple:
        """(model file, artifact, package) of a build; the model file written if not yet. Each
        name is one build (the export settings above are the same for all), so the files are
        named after it: tests read `<family>.pt2` and `<family>_lm.py` from `root`."""
        source = self.root / f"{family}_lm.py"
        text = GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / f"{family}.py"))
        shared_store.once(source, lambda: source.write_text(text))
        return source, self.root / f"{name}.pt2", self.root / f"{name}_pkg"

    @staticmethod
    def _commands(source: Path, artifact: Path, package: Path, *export_flags) -> tuple:
        batch = [] if "--batch-size" in export_flags else ["--batch-size", GENERATION_BATCH]
        length = [] if "--max-seq-len" in export_flags else ["--max-seq-len", GENERATION_MAX_LEN]
        export = ["export", source, "--task", "text-generation", *length, *batch, *export_flags,
                  "-o", artifact]  # fmt: skip
        return export, ["build", artifact, "--device", "cpu", "-o", package, "--quiet"]

    def _build(self, family: str, name: str, *export_flags, source: Path | None = None) -> tuple:
        """`source`: a model file of its own instead of the zoo family's."""
        zoo_source, artifact, package = self._files(family, name, *export_flags)
        source = source or zoo_source
        if self.ahead.submitted(name):
            self.ahead.wait(name, package)
        else:

            def make() -> None:
                for command in self._commands(source, artifact, package, *export_flags):
                    done = invoke(*command)
                    assert done.exit_code == 0, done.stderr

            shared_store.once(package, make, outputs=[artifact])
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


def shared_tiny_tokenizer(store_root: Path) -> Path:
    """tiny_tokenizer's folder in the run's store, written once for the `tokenizer` fixture and
    GPT-2's package with a tokenizer alike."""
    folder = store_root / "tiny_tokenizer"
    shared_store.once(folder, lambda: tiny_tokenizer(folder))
    return folder


@pytest.fixture(scope="session")
def tokenizer(store_root):
    """tiny_tokenizer's word-level tokenizer, loaded with `tokenizers`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(shared_tiny_tokenizer(store_root) / "tokenizer.json"))


# ChatML spelled in tiny_tokenizer's words: w1 a user's turn, w2 the assistant's, w3 the system's,
# w4 the end of a turn
CHATML_WORDS_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] not in ('user', 'assistant', 'system') -%}"
    "{{ raise_exception('no role ' + m['role']) }}{%- endif -%}"
    "{{ {'user': 'w1', 'assistant': 'w2', 'system': 'w3'}[m['role']] }} {{ m['content'] }} w4 "
    "{% endfor -%}"
    "{%- if add_generation_prompt %}w2{% endif -%}"
)


def with_chat_template(package: Path, target: Path, eos=None) -> Path:
    """A copy of the package carrying CHATML_WORDS_TEMPLATE, hashed as a build hashes it; `eos`
    replaces its end-of-sequence ids."""

    def write(folder):
        (folder / "chat_template.jinja").write_text(CHATML_WORDS_TEMPLATE)

    def edit(manifest):
        manifest["generation"]["chat_template"] = "chat_template.jinja"
        if eos is not None:
            manifest["generation"]["eos_token_ids"] = eos

    return tampered_copy(package, target, edit=edit, files=write)


@pytest.fixture(scope="session")
def chat_lm(generation_packages) -> Path:
    """GPT-2's package with tiny_tokenizer and CHATML_WORDS_TEMPLATE: the served chat model, named
    (after its folder) chat_pkg."""
    plain = generation_packages.with_tokenizer()[0]
    target = generation_packages.root / "chat_pkg"
    shared_store.once(target, lambda: with_chat_template(plain, target))
    return target


@pytest.fixture(scope="session")
def generation_packages(store_root) -> Iterator[GenerationBuilds]:
    (store_root / "generation").mkdir(exist_ok=True)
    builds = GenerationBuilds(store_root / "generation")
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
            "on a GPU machine run scripts/gpu_install.sh (make test-gpu does; offline: docs/gpu.md), "
            "elsewhere make test"
        )
    validator = jsonschema.Draft202012Validator(json.loads(MANIFEST_SCHEMA.read_text()))
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]


def pytest_configure(config):
    """In a pytest-xdist worker: one CPU thread for torch, for the OpenMP of the commands it runs in
    child processes, and for Inductor's compile workers, so that `make test`'s 2 workers keep the
    machine's 2 cores busy rather than 4 builds or 8 threads fighting over them."""
    worker = shared_store.worker()
    if worker:
        import os

        for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
            os.environ[name] = "1"
        torch.set_num_threads(1)
        # Inductor's cache, one per worker: two workers compiling the same graph at once into one
        # cache gave a package whose compiled model described the other worker's artifact (its
        # build's check refused it, exit 5). It lives in the run's temporary folder (xdist gives
        # each worker popen-gwN in it), which goes with a passing run: in /tmp it grew by every
        # run's builds, on a CI disk that runs share.
        if config.option.basetemp:
            run = shared_store.run_root(Path(config.option.basetemp))
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(run / f"inductor-{worker}")
        else:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{cache_dir()}-{worker}"


def xdist_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs whole, one after another: a test file, so that its module
    fixtures are made once; and every test_serve*.py file together, so that two Ray instances never
    share the machine (ports, /tmp/ray, memory)."""
    path = nodeid.split("::")[0]
    return "serve" if Path(path).name.startswith("test_serve") else path


@pytest.hookimpl(optionalhook=True)  # a GPU machine runs the GPU tests without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s `-n 2` hands out xdist_unit's units (pytest-xdist's --dist loadgroup would
    do it from marks, but its node-id suffix has no effect under pytest 9.2, and every test went
    its own way). The largest units go first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return ByUnit(config, log)


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
    from filelock import FileLock

    from aotc.deploy.cpp_runner import BUILD_DIR, build_runner

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with FileLock(BUILD_DIR / "tests.lock"):  # pytest-xdist workers: one cmake at a time
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
