"""aotc's text-generation export against the installed transformers release: every family of the
zoo, and a saved model folder, exported through `aotc export --task text-generation` and the
artifact's program run eagerly as a greedy loop, token for token against transformers' own
`generate` on the same weights.

What breaks when transformers changes is the export: the hooks aotc puts into the model's code
(row_cache.py) and the arguments it calls it with. Compiling the artifact does not depend on the
release (test_generate.py compiles every family on the pinned release), so these tests compile
nothing and cost seconds a family. `make test` runs them twice: in the suite, on the pinned
release, and again on the newest release of the supported range (requirements-newest.txt).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import (
    GENERATION_BATCH,
    GENERATION_FAMILIES,
    GENERATION_MAX_LEN,
    GENERATION_MODEL_FILE,
    ZOO,
    error_lines,
    invoke,
    load_model_file,
    save_llama_folder,
)
from test_generate import prompts  # the two left-padded prompts test_generate compiles

from aotc.export.artifact import load_artifact
from aotc.export.eager_reference import EagerRun
from aotc_runtime.decode_step import pack
from aotc_runtime.generation import prefill_inputs

NEW_TOKENS = 16
# where `make test` installs the newest release, over the pinned one (Makefile)
NEWEST_OVERLAY = ".transformers-newest"


def artifact_greedy(artifact: Path, ids, mask, new_tokens: int) -> torch.Tensor:
    """[B, prompt + new_tokens]: the artifact's step run eagerly (its KV cache carried from call to
    call, as the runtimes carry it), prefill then greedy decode, no stop."""
    ep, meta = load_artifact(artifact)
    run = EagerRun(ep, meta.signature, "cpu")
    tokens = [run.call("prefill", prefill_inputs(ids, mask))[0].argmax(-1)]
    held = mask.sum(-1).tolist()
    for step in range(new_tokens - 1):
        feeds = [(row, held[row] + step, [int(tokens[-1][row])]) for row in range(len(held))]
        tokens.append(run.call(f"decode {step}", pack(feeds))[0].argmax(-1))
    return torch.cat([ids, torch.stack(tokens, 1)], 1)


def export_generation(model: Path, artifact: Path, *flags) -> None:
    done = invoke("export", model, "--task", "text-generation", "--max-seq-len", GENERATION_MAX_LEN,
                  "--batch-size", GENERATION_BATCH, *flags, "-o", artifact)  # fmt: skip
    assert done.exit_code == 0, done.stderr


@pytest.mark.parametrize("family", GENERATION_FAMILIES)
def test_each_family_exports_and_generates_what_transformers_generates(family, tmp_path):
    source = tmp_path / f"{family}_lm.py"
    source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / f"{family}.py")))
    export_generation(source, tmp_path / "lm.pt2")
    model = load_model_file(source)
    ids, mask = prompts()
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)  # fmt: skip
    got = artifact_greedy(tmp_path / "lm.pt2", ids, mask, NEW_TOKENS)
    assert got.tolist() == expected.tolist()
    assert len(set(got[:, 7:].flatten().tolist())) > 4, "a degenerate sequence tests little"


def test_a_saved_folder_exports_and_generates_what_transformers_generates(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save_llama_folder(tmp_path / "tiny-llama")
    export_generation(folder, tmp_path / "lm.pt2")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7], [300, 12, 8, 64, 201]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                                  do_sample=False)  # fmt: skip
    got = artifact_greedy(tmp_path / "lm.pt2", ids, mask, 8)
    assert got.tolist() == expected.tolist()
    assert len(set(got[:, 5:].flatten().tolist())) > 2, "a degenerate sequence tests little"


def test_the_release_under_test_is_the_one_installed():
    """The suite runs on requirements.txt's release, the second run on requirements-newest.txt's:
    the version this process imported is the one its requirements name (an overlay that failed to
    take would silently test the pinned release twice)."""
    import transformers

    root = Path(__file__).parent.parent
    overlay = str(root / NEWEST_OVERLAY)
    from_overlay = str(transformers.__file__).startswith(overlay)
    expected_file = "requirements-newest.txt" if from_overlay else "requirements.txt"
    pins = [line.split("==")[1].strip() for line in (root / expected_file).read_text().splitlines()
            if line.startswith("transformers==")]  # fmt: skip
    assert pins == [transformers.__version__]


@pytest.fixture
def fake_release(monkeypatch):
    """fake_release("6.0.0"): aotc sees that transformers release installed (its once-per-process
    warning made to say it again)."""
    from aotc.export import transformers_release

    def fake(version: str) -> None:
        monkeypatch.setattr(transformers_release, "installed_release", lambda: version)
        transformers_release.warn_if_untested.cache_clear()

    yield fake
    transformers_release.warn_if_untested.cache_clear()


@pytest.mark.parametrize("version", ["6.0.0", "5.9.1", "5.25.0.dev0"])
def test_an_untested_release_gets_one_warning_line_naming_the_tested_range(
    version, fake_release, tmp_path
):
    """`aotc export --task` on an untested release says so in one line on stderr, and exports."""
    source = tmp_path / "gpt2_lm.py"
    source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / "gpt2.py")))
    fake_release(version)
    done = invoke("export", source, "--task", "text-generation", "--max-seq-len", 16,
                  "--batch-size", 1, "-o", tmp_path / "lm.pt2")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: transformers {version} is outside the releases aotc is tested with "
        "(5.17.0 to 5.24.x); if the export fails, install a tested one: "
        "pip install 'aotc[transformers]'"
    ], done.stderr


@pytest.mark.parametrize("version", ["5.17.0", "5.24.3"])
def test_a_tested_release_gets_no_warning(version):
    from aotc.export.transformers_release import untested_warning

    assert untested_warning(version) is None


def test_a_hook_that_breaks_ends_with_exit_3_naming_the_release_and_range(
    tmp_path, monkeypatch, fake_release
):
    """A release whose model code calls the cache in a way aotc's layer was not written for (here
    the layer's update made to refuse what it is given): exit 3 and one line, no internal error."""
    from aotc.export import row_cache

    source = tmp_path / "llama_lm.py"
    source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / "llama.py")))
    layer = row_cache._row_layer_class()

    def changed_convention(self, key_states, value_states, layer_idx_and_more):
        raise AssertionError("unreachable: the model passes more than this")

    monkeypatch.setattr(layer, "update", changed_convention)
    fake_release("6.1.0")
    done = invoke("export", source, "--task", "text-generation", "--max-seq-len", 16,
                  "--batch-size", 1, "-o", tmp_path / "lm.pt2")  # fmt: skip
    assert done.exit_code == 3, done.stderr
    errors = [line for line in error_lines(done.stderr) if not line.startswith("warning:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith("error: LlamaForCausalLM fails in aotc's generation hooks under "
                                "transformers 6.1.0 (TypeError: "), errors[0]  # fmt: skip
    assert "aotc supports transformers >=5.17.0,<6, tested 5.17.0 to 5.24.x" in errors[0]
    assert errors[0].endswith("install a tested release: pip install 'aotc[transformers]'")
    assert not (tmp_path / "lm.pt2").exists()
