"""`aotc export MODEL_DIR`: a folder save_pretrained wrote, exported without a model file.

One tiny Llama (tied embeddings, weights in five safetensors shards, a word-level tokenizer with
a chat template, generation_config.json naming two end-of-sequence ids) is exported and built
once; the package is held against transformers' from_pretrained of the same folder. The
refusals each run on a copy of the folder with one thing wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CHAT_TEMPLATE, error_lines, invoke, save_llama_folder

MAX_LEN, BATCH, NEW_TOKENS = 32, 2, 8


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    return save_llama_folder(tmp_path_factory.mktemp("folder") / "tiny-llama")


@pytest.fixture(scope="module")
def folder_package(llama_folder, tmp_path_factory) -> tuple:
    """(artifact, package, the export's stdout) of the folder, exported and built once."""
    out = tmp_path_factory.mktemp("folder_pkg")
    artifact, package = out / "lm.pt2", out / "lm_pkg"
    exported = invoke("export", llama_folder, "--task", "text-generation", "--max-seq-len",
                      MAX_LEN, "--batch-size", BATCH, "-o", artifact)  # fmt: skip
    assert exported.exit_code == 0, exported.stderr
    built = invoke("build", artifact, "--device", "cpu", "-o", package, "--quiet")
    assert built.exit_code == 0, built.stderr
    return artifact, package, exported.stdout


def refused(result, code: int, *words: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.stderr


def test_the_folder_is_sharded_and_ties_its_embeddings(llama_folder):
    index = json.loads((llama_folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]  # written once, as the embedding


def test_the_package_generates_what_transformers_generates_from_the_folder(
    llama_folder, folder_package
):
    from transformers import AutoModelForCausalLM

    import aotc_runtime

    _artifact, package, stdout = folder_package
    model = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    prompts = torch.tensor([[5, 17, 42, 99, 7], [300, 12, 8, 64, 201]])
    with torch.no_grad():
        expected = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                  max_new_tokens=NEW_TOKENS, do_sample=False)  # fmt: skip
    got = aotc_runtime.load(package).generate(prompts, max_new_tokens=NEW_TOKENS)
    assert got.tolist() == expected.tolist()
    assert len(set(got[:, 5:].flatten().tolist())) > 2, "a degenerate sequence tests little"
    # one line for the whole KV cache, not one per layer and kind
    assert [line for line in stdout.splitlines() if "state" in line] == [
        "  state  KV cache: 2 layers of keys and values, float32 [2, 33, 2, 16] each, 33.0 KiB "
        "(forward updates it; the package keeps it between calls)"
    ]


def test_the_tokenizer_chat_template_and_stop_ids_travel_into_the_package(
    llama_folder, folder_package
):
    import aotc_runtime

    _artifact, package, _stdout = folder_package
    manifest = json.loads((package / "manifest.json").read_text())
    generation = manifest["generation"]
    assert generation["eos_token_ids"] == [2, 3]  # generation_config.json's, not config.json's 2
    assert generation["tokenizer"] == "tokenizer.json"
    assert generation["chat_template"] == "chat_template.jinja"
    assert generation["special_tokens"] == {"bos_token": "<s>", "eos_token": "</s>",
                                            "pad_token": "[UNK]", "unk_token": "[UNK]"}  # fmt: skip
    assert {"tokenizer.json", "chat_template.jinja"} <= set(manifest["files"])
    assert (package / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    loaded = aotc_runtime.load(package)
    assert loaded.manifest.generation.chat_template == "chat_template.jinja"
    assert loaded.tokenizer.encode("w5 w17").ids == [5, 17]


def test_a_tampered_chat_template_is_refused_at_load(folder_package, tmp_path):
    import aotc_runtime

    _artifact, package, _stdout = folder_package
    copy = tmp_path / "tampered"
    shutil.copytree(package, copy)
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(aotc_runtime.PackageError, match="chat_template.jinja"):
        aotc_runtime.load(copy)


def test_the_configs_dtype_is_honoured_and_dtype_overrides_it(tmp_path):
    from aotc.export.model_folder import load_model_folder

    folder = save_llama_folder(tmp_path / "bf16", torch.bfloat16)
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    half = load_model_folder(folder).module
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    full = load_model_folder(folder, "float32").module
    assert {p.dtype for p in full.parameters()} == {torch.float32}
    assert full.lm_head.weight is full.model.embed_tokens.weight  # still tied
    torch.testing.assert_close(full.lm_head.weight, half.lm_head.weight.float())


def test_weights_with_tied_embeddings_load_into_a_model_file(llama_folder, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from aotc.export.loading import load_model
    from aotc.export.weights import load_weights

    saved = AutoModelForCausalLM.from_pretrained(llama_folder)
    state = {k: v for k, v in saved.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "lm.py").write_text(
        "from transformers import AutoConfig, AutoModelForCausalLM\n"
        f"def get_model():\n    return AutoModelForCausalLM.from_config("
        f"AutoConfig.from_pretrained({str(llama_folder)!r}))\n"
    )
    module = load_model(str(tmp_path / "lm.py")).module
    load_weights(module, tmp_path / "model.safetensors")
    for name, tensor in saved.state_dict().items():
        torch.testing.assert_close(module.state_dict()[name], tensor, rtol=0, atol=0)
    # a state_dict of another model is refused with the names that differ
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    refused(
        invoke("export", tmp_path / "lm.py", "--task", "text-generation", "--max-seq-len", 16,
               "--weights", tmp_path / "other.safetensors", "-o", tmp_path / "x.pt2"),
        2, "does not fit the model: missing model.embed_tokens.weight", "unexpected w",
    )  # fmt: skip


def broken_copy(source: Path, target: Path, change) -> Path:
    shutil.copytree(source, target)
    change(target)
    return target


def edit_config(**changes):
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))

    return change


def only_pickle_weights(folder: Path) -> None:
    for path in folder.glob("model*.safetensors*"):
        path.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not read")


def index_outside(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "change, words",
    [
        (edit_config(auto_map={"AutoModelForCausalLM": "modeling_x.X"}),
         ("names custom model code (auto_map", "trust_remote_code=True", "aotc export lm.py")),
        (lambda f: (f / "modeling_x.py").write_text("raise SystemExit"),
         ("holds Python code (modeling_x.py)", "aotc export lm.py")),
        (only_pickle_weights, ("only as pickle files (pytorch_model.bin)", "save_pretrained")),
        (lambda f: (f / "config.json").unlink(), ("has no config.json",)),
        (edit_config(quantization_config={"quant_method": "gptq"}),
         ("quantized checkpoint (gptq)", "--quantize")),
        (edit_config(model_type="no-such-model"), ("model_type 'no-such-model'",)),
        (index_outside, ("'../elsewhere.safetensors', not a .safetensors file of the folder",)),
        (lambda f: (f / "config.json").write_text("[" * 100_000),
         ("config.json is not valid JSON",)),
    ],
    ids=["auto_map", "python-file", "pickle-only", "no-config", "quantized", "unknown-type",
         "index-outside", "deep-json"],
)  # fmt: skip
def test_a_folder_that_would_run_code_or_is_not_a_model_is_refused_in_one_line(
    llama_folder, tmp_path, change, words
):
    folder = broken_copy(llama_folder, tmp_path / "broken", change)
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, *words)


def test_dtype_with_task_is_the_models_and_an_input_dtype_is_refused(llama_folder, tmp_path):
    result = invoke("export", llama_folder, "--task", "text-generation", "--max-seq-len", 16,
                    "--dtype", "int64", "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, "--dtype is the model's dtype", "float32, bfloat16, float16")


def test_a_bfloat16_export_keeps_a_bfloat16_cache(llama_folder, tmp_path):
    """--dtype with --task is honoured: the step runs, and keeps its cache, in that dtype."""
    result = invoke("export", llama_folder, "--task", "text-generation", "--max-seq-len", 16,
                    "--batch-size", 1, "--dtype", "bfloat16", "-o", tmp_path / "lm.pt2", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    signature = json.loads(result.stdout)["signature"]
    assert {s["dtype"] for s in signature["state"]} == {"bfloat16"}
    assert signature["outputs"][0]["dtype"] == "bfloat16"


GPT_NEO = """
from transformers import GPTNeoConfig, GPTNeoForCausalLM


def get_model():
    return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=256, hidden_size=32, num_layers=2,
        num_heads=4, attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
        window_size=8, bos_token_id=0, eos_token_id=0))
"""


def test_a_model_generation_packages_cannot_hold_is_sent_to_an_export_that_works(tmp_path):
    """GPTNeo's attention is its own code: --task refuses it and names the one-call export,
    which then works (its KV cache output turned off)."""
    model_file = tmp_path / "neo.py"
    model_file.write_text(GPT_NEO)
    result = invoke("export", model_file, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "neo.pt2")  # fmt: skip
    command = f"aotc export {model_file} --input-shape input_ids=1x16 --dtype int64"
    refused(result, 2, "GPTNeoForCausalLM cannot run over a static KV cache", command)
    args = command.split()[3:]  # after `aotc export MODEL`
    result = invoke("export", model_file, *args, "-o", tmp_path / "neo.pt2")
    assert result.exit_code == 0, result.stderr
    assert "exported without its KV cache output" in result.stderr


def link_out(name: str, target: Path | None = None):
    """`name` in the folder replaced by a link to a file outside it (a secret, by default)."""

    def change(folder: Path) -> None:
        outside = target
        if outside is None:
            outside = folder.parent / "secret.pem"
            outside.write_text((folder / name).read_text() if name.endswith(".json") else "KEY")
        (folder / name).unlink()
        (folder / name).symlink_to(outside)

    return change


@pytest.mark.parametrize(
    "change, words",
    [
        (link_out("chat_template.jinja", Path("/proc/self/environ")),
         ("chat_template.jinja is a link to /proc/", "outside", "copy the file itself")),
        (link_out("config.json"), ("config.json is a link to", "secret.pem, outside")),
        (link_out("tokenizer.json"), ("tokenizer.json is a link to", "secret.pem, outside")),
        (link_out("model-00001-of-00005.safetensors"),
         ("model-00001-of-00005.safetensors is a link to", "outside")),
    ],
    ids=["template-to-environ", "config-to-key", "tokenizer-to-key", "shard-outside"],
)  # fmt: skip
def test_a_link_out_of_the_folder_is_refused_and_nothing_of_it_is_written(
    llama_folder, tmp_path, change, words
):
    """A folder file that links elsewhere would carry that file (the exporting process's
    environment, a private key) into the artifact, the package and its signature."""
    folder = broken_copy(llama_folder, tmp_path / "linked", change)
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, *words)
    assert not (tmp_path / "lm.pt2").exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors.index.json"])
def test_a_fifo_in_the_folder_is_refused_at_once_not_waited_on(llama_folder, tmp_path, name):
    """A FIFO blocks whoever opens it until a writer comes: the export refuses it in one line
    (in a child with a deadline, so that a hang fails the test rather than the suite)."""
    import os
    import subprocess
    import sys

    folder = broken_copy(llama_folder, tmp_path / "fifo", lambda f: (f / name).unlink())
    os.mkfifo(folder / name)
    done = subprocess.run(
        [sys.executable, "-m", "aotc", "export", str(folder), "--task", "text-generation",
         "--max-seq-len", "16", "-o", str(tmp_path / "lm.pt2")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and f"{name} is a FIFO, not a regular file" in lines[0], done.stderr


def test_a_hub_cache_snapshot_whose_files_link_into_its_blobs_exports(llama_folder, tmp_path):
    """huggingface_hub's cache keeps each file once in blobs/ and links snapshots/<rev>/<name>
    to it: that layout is the one link out of a folder aotc follows."""
    repo = tmp_path / "models--tiny--llama"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, path in enumerate(sorted(llama_folder.iterdir())):
        blob = blobs / f"blob{number}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    result = invoke("export", snapshot, "--task", "text-generation", "--max-seq-len", 16,
                    "--batch-size", 1, "-o", tmp_path / "lm.pt2")  # fmt: skip
    assert result.exit_code == 0, result.stderr


# A child `aotc` that reports its own peak resident memory on its last stderr line: VmHWM, its
# peak since its exec (ru_maxrss starts at the forking process's, and a pytest that has run the
# whole suite in one process holds about 1 GiB)
_MEASURED_AOTC = """
import sys
from aotc.cli.main import main
try:
    main(sys.argv[1:])
finally:
    peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(f"peak_rss_kib={peak.split()[1]}", file=sys.stderr)
"""


def measured_aotc(*args, timeout: float = 300) -> tuple:
    """(exit code, stderr without the measurement, peak RSS in MiB, seconds) of an aotc child."""
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURED_AOTC, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    seconds = time.perf_counter() - started
    *lines, last = done.stderr.strip().splitlines()
    assert last.startswith("peak_rss_kib="), done.stderr
    return done.returncode, "\n".join(lines), int(last.split("=")[1]) / 1024, seconds


# An export that stops before the model is built imports torch and transformers: about 0.5 GiB.
REFUSAL_PEAK_MIB, REFUSAL_SECONDS = 1024, 120


@pytest.mark.parametrize(
    "value, words",
    [
        (
            100_000,
            ("num_hidden_layers 100000, but its weight files hold", "fewer than one a layer"),
        ),
        (10**400, ("num_hidden_layers 1000000000000", "fewer than one a layer")),
        (-1, ("num_hidden_layers -1, not a positive whole number of layers",)),
        ("2", ("num_hidden_layers 2, not a positive whole number",)),
    ],
    ids=["100k", "10^400", "negative", "text"],
)
def test_a_layer_count_the_weights_cannot_fill_is_refused_before_anything_is_built(
    llama_folder, tmp_path, value, words
):
    """transformers builds every layer the config names before the weights are compared: the
    count is held against the weight files' headers first, in bounded memory and time."""

    def change(folder: Path) -> None:
        text = (folder / "config.json").read_text()
        config = json.loads(text)
        config["num_hidden_layers"] = "__N__"
        (folder / "config.json").write_text(
            json.dumps(config).replace('"__N__"', json.dumps(value))
        )

    folder = broken_copy(llama_folder, tmp_path / "layers", change)
    code, stderr, peak, seconds = measured_aotc(
        "export", folder, "--task", "text-generation", "--max-seq-len", 16, "-o", tmp_path / "x.pt2"
    )
    assert code == 2 and len(error_lines(stderr)) == 1, stderr
    assert all(word in stderr for word in words), stderr
    assert peak < REFUSAL_PEAK_MIB and seconds < REFUSAL_SECONDS, (peak, seconds)


@pytest.mark.parametrize(
    "templates", [[{"name": ["x"], "template": "hi"}], ["hi"], [{"template": "hi"}]]
)
def test_a_named_template_list_that_is_not_one_is_refused_naming_the_field(
    llama_folder, tmp_path, templates
):
    def change(folder: Path) -> None:
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["chat_template"] = templates
        (folder / "tokenizer_config.json").write_text(json.dumps(config))

    folder = broken_copy(llama_folder, tmp_path / "templates", change)
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, "tokenizer_config.json: chat_template[0] is not a named template")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"rope_parameters": {"rope_type": "evil", "rope_theta": 10000.0}},
         ("rope_parameters.rope_type 'evil' is not a RoPE type transformers knows",)),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}},
         ("rope_scaling.factor is -2.0, not a positive number",)),
        ({"text_config": {"hidden_size": 64}}, ("has a text_config, which a llama config",)),
        ({"hidden_size": -64}, ("hidden_size is -64, not a whole number of at least 1",)),
        ({"intermediate_size": 1.5}, ("intermediate_size is 1.5, not a whole number",)),
        ({"rms_norm_eps": float("nan")}, ("rms_norm_eps is nan, not a positive number",)),
        ({"rms_norm_eps": -1}, ("rms_norm_eps is -1, not a positive number",)),
        ({"sliding_window": -1}, ("sliding_window is -1, not null or a whole number",)),
    ],
    ids=["rope-type", "rope-factor", "text-config", "negative-size", "fractional-size", "eps-nan",
         "eps-negative", "window-negative"],
)  # fmt: skip
def test_an_invalid_config_value_is_refused_naming_its_field(
    llama_folder, tmp_path, changes, words
):
    """Values transformers would build from as they come (a KeyError, a negative dimension, a
    model whose outputs are all NaN, a window aotc's check then blames on its own attention)."""
    folder = broken_copy(llama_folder, tmp_path / "config", edit_config(**changes))
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(
        result, 2, "config.json: " if "text_config" not in changes else "config.json has", *words
    )


def test_weights_that_make_the_models_own_outputs_nan_are_named_as_such(llama_folder, tmp_path):
    """Not "aotc's attention disagrees": the model's own logits are NaN before aotc changes
    anything (exit 3, the model fails on its inputs)."""
    from safetensors.torch import load_file, save_file

    def nan_norm(folder: Path) -> None:
        for path in folder.glob("*.safetensors"):
            tensors = load_file(str(path))
            if "model.norm.weight" in tensors:
                tensors["model.norm.weight"] = torch.full_like(
                    tensors["model.norm.weight"], torch.nan
                )
                save_file(tensors, str(path), metadata={"format": "pt"})

    folder = broken_copy(llama_folder, tmp_path / "nan", nan_norm)
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 3, "LlamaForCausalLM's own logits are not finite", "check the checkpoint")


def grown_tokenizer(stage: str):
    """The folder's tokenizer.json with a `stage` that replaces a character by 300,000."""

    def change(folder: Path) -> None:
        data = json.loads((folder / "tokenizer.json").read_text())
        data[stage] = {"type": "Replace", "pattern": {"String": "w"}, "content": "w5 " * 100_000}
        (folder / "tokenizer.json").write_text(json.dumps(data))

    return change


@pytest.mark.parametrize("stage", ["normalizer", "decoder"])
def test_a_tokenizer_that_grows_text_without_bound_is_refused_at_export(
    llama_folder, tmp_path, stage
):
    """A one-character prompt would cost gigabytes inside the `tokenizers` library."""
    folder = broken_copy(llama_folder, tmp_path / "grown", grown_tokenizer(stage))
    result = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 16,
                    "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, f"its {stage} replaces text with text up to 300000 times as long",
            "aotc takes at most 16 times")  # fmt: skip


def test_a_package_whose_tokenizer_grows_text_is_refused_at_load_in_bounded_memory(
    folder_package, tmp_path
):
    """An unsigned package re-hashed around such a tokenizer: `aotc generate --prompt` refuses it
    (exit 7, one line) before the library reads it, in the memory a refusal takes."""
    from conftest import tampered_copy

    _artifact, package, _stdout = folder_package
    copy = tampered_copy(package, tmp_path / "grown", files=grown_tokenizer("normalizer"))
    code, stderr, peak, seconds = measured_aotc("generate", copy, "--prompt", "w5 w7 w9",
                                                "--max-new-tokens", 2)  # fmt: skip
    assert code == 7 and len(stderr.splitlines()) == 1, stderr
    assert "its tokenizer tokenizer.json is refused: its normalizer replaces text" in stderr
    assert peak < REFUSAL_PEAK_MIB and seconds < REFUSAL_SECONDS, (peak, seconds)
