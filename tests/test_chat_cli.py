"""`aotc chat` in a real terminal (tmux): the streamed reply equals the package's own greedy
generate of the prompt transformers' apply_chat_template makes of the history; /reset, the end of
input, the history dropped when it no longer fits, and a package without a chat template."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GENERATION_MODEL_FILE, ZOO, invoke, tampered_copy
from test_chat_template import CHATML

import aotc_runtime

MAX_LEN, NEW = 64, 6
SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}


def chat_tokenizer(folder: Path) -> Path:
    """Word-level: "w7" is id 7 (w0..w499), then the roles, then ChatML's special tokens."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(500)} | {"user": 500, "assistant": 501, "system": 502}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL.values()])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def with_template(package: Path, target: Path, template: str) -> Path:
    """A copy of the package carrying `template` as its chat template (manifest re-hashed)."""

    def add(folder):
        (folder / "chat_template.jinja").write_text(template)

    def record(manifest):
        manifest["generation"].update(chat_template="chat_template.jinja", special_tokens=SPECIAL)

    return tampered_copy(package, target, edit=record, files=add)


@pytest.fixture(scope="module")
def chat_package(tmp_path_factory):
    """GPT-2 of the zoo (weights scaled) with the word-level tokenizer, batch 1, a 64-token cache,
    and the ChatML template: (package, the same tokenizer as transformers')."""
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("chat")
    source = root / "gpt2_lm.py"
    source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / "gpt2.py")))
    folder = chat_tokenizer(root / "tokenizer")
    export = invoke("export", source, "--task", "text-generation", "--max-seq-len", MAX_LEN,
                    "--batch-size", 1, "--tokenizer", folder, "-o", root / "lm.pt2")  # fmt: skip
    assert export.exit_code == 0, export.stderr
    build = invoke("build", root / "lm.pt2", "--device", "cpu", "-o", root / "plain_pkg", "--quiet")
    assert build.exit_code == 0, build.stderr
    package = with_template(root / "plain_pkg", root / "chat_pkg", CHATML)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **SPECIAL)
    return package, hf


def expected_reply(package: Path, hf, messages: list) -> str:
    """The package's greedy generate of the prompt transformers renders, decoded."""
    ids = hf.apply_chat_template(
        messages, chat_template=CHATML, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    loaded = aotc_runtime.load(package)
    new = loaded.generate([ids], max_new_tokens=NEW)[0, len(ids) :].tolist()
    eos = set(loaded.generation.eos_token_ids)
    new = new[: next((i for i, t in enumerate(new) if t in eos), len(new))]
    return hf.decode(new, skip_special_tokens=True)


class Terminal:
    """A tmux session running one command, read back as its screen shows it."""

    def __init__(self, command: str, name: str):
        self.name = name
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                        f"{command}; echo EXITED $?; sleep 60"], check=True)  # fmt: skip

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        done = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-t", self.name, "-S", "-200"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        return done.stdout

    def wait_for(self, text: str, count: int = 1, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if screen.count(text) >= count:
                return screen
            time.sleep(0.3)
        raise AssertionError(f"{text!r} x{count} never showed; the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def chat(*args, input: str):
    """`aotc chat ARGS` in-process with `input` as its standard input (not a terminal)."""
    from click.testing import CliRunner

    from aotc.cli.main import cli

    return CliRunner().invoke(cli, ["chat", *map(str, args)], input=input, catch_exceptions=False)


def replies(screen: str) -> list[str]:
    """What followed each prompt line: the replies, in order."""
    lines = screen.splitlines()
    return [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("> w")]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make test installs it)")
def test_aotc_chat_in_a_terminal_streams_the_packages_greedy_reply(chat_package):
    package, hf = chat_package
    aotc = Path(sys.executable).parent / "aotc"
    terminal = Terminal(f"{aotc} chat {package} --max-new-tokens {NEW}", "aotc-chat-test")
    try:
        terminal.wait_for("> ")
        terminal.send("w5 w17", "Enter")
        terminal.wait_for("> ", 2)
        terminal.send("w9 w300", "Enter")
        terminal.wait_for("> ", 3)
        terminal.send("/reset", "Enter")
        terminal.wait_for("(history cleared)")
        terminal.send("w5 w17", "Enter")
        terminal.wait_for("> ", 5)
        terminal.send("C-d")
        screen = terminal.wait_for("EXITED")
    finally:
        terminal.close()
    first = expected_reply(package, hf, [{"role": "user", "content": "w5 w17"}])
    second = expected_reply(package, hf, [
        {"role": "user", "content": "w5 w17"}, {"role": "assistant", "content": first},
        {"role": "user", "content": "w9 w300"},
    ])  # fmt: skip
    assert first and second
    assert replies(screen) == [first, second, first], screen
    assert "EXITED 0" in screen and "Traceback" not in screen


def test_a_chats_next_turn_is_fed_only_what_follows_the_last_one(chat_package):
    """The session keeps a prefix cache: the second turn's prompt starts with the first's and its
    reply, which the cache's row still holds, and its reply is the one a whole prefill gives."""
    from aotc_runtime.chat_session import ChatSession
    from aotc_runtime.chat_template import ChatTemplate

    package, hf = chat_package
    loaded = aotc_runtime.load(package)
    session = ChatSession(loaded, ChatTemplate.of_package(loaded), max_new_tokens=NEW)
    opening = " ".join(f"w{i}" for i in range(40, 56))  # 16 words: a start worth reusing
    first = "".join(session.reply(opening))
    assert session.prefix_cache.reused_tokens == 0
    second = "".join(session.reply("w9 w300"))
    assert session.prefix_cache.reused_tokens >= 16
    assert first == expected_reply(package, hf, [{"role": "user", "content": opening}])
    assert second == expected_reply(package, hf, [
        {"role": "user", "content": opening}, {"role": "assistant", "content": first},
        {"role": "user", "content": "w9 w300"},
    ])  # fmt: skip


def test_help_lists_the_commands_and_a_cut_reply_says_so(chat_package):
    """/help goes to no model; a reply that used all of --max-new-tokens says it stopped there
    (this package's reply to "w5 w17" has no end-of-sequence id in its first NEW tokens)."""
    package, hf = chat_package
    done = chat(package, "--max-new-tokens", NEW, input="/help\nw5 w17\n/exit\n")
    assert done.exit_code == 0, done.stderr
    assert "(/reset clears the history, /exit (or Ctrl-D) leaves, /help lists these)" in done.stderr
    reply = expected_reply(package, hf, [{"role": "user", "content": "w5 w17"}])
    assert done.stdout.splitlines() == [reply]  # /help made no reply
    assert f"(the reply stopped at --max-new-tokens {NEW}; raise it for longer replies)" in (
        done.stderr
    )


def test_a_reply_is_cut_only_when_it_used_all_its_new_tokens(chat_package, tmp_path):
    """The same message on a copy whose end-of-sequence id is the reply's first token: the reply
    ends there, and is not cut."""
    from aotc_runtime.chat_session import ChatSession
    from aotc_runtime.chat_template import ChatTemplate

    package, _hf = chat_package

    def session_of(folder):
        loaded = aotc_runtime.load(folder)
        return loaded, ChatSession(loaded, ChatTemplate.of_package(loaded), max_new_tokens=NEW)

    loaded, session = session_of(package)
    "".join(session.reply("w5 w17"))
    assert session.cut
    prompt = session_of(package)[1].prompt_ids("w9")
    first = int(loaded.generate([prompt], max_new_tokens=1)[0, len(prompt)])
    ends = tampered_copy(package, tmp_path / "ends",
                         lambda m: m["generation"].update(eos_token_ids=[first]))  # fmt: skip
    _loaded, session = session_of(ends)
    "".join(session.reply("w9"))
    assert not session.cut


def test_the_oldest_turns_are_dropped_when_the_history_no_longer_fits(chat_package):
    package, hf = chat_package
    message = " ".join(f"w{i}" for i in range(1, 31))  # 30 words: two turns do not fit 64
    done = chat(package, "--max-new-tokens", NEW, input=f"{message}\nw7\n/exit\n")
    assert done.exit_code == 0, done.stderr
    assert (
        "(dropped the oldest 1 turn: the history no longer fits the package's 64-token cache)"
        in done.stderr
    )
    alone = expected_reply(package, hf, [{"role": "user", "content": "w7"}])
    assert done.stdout.splitlines()[-1] == alone


def test_a_package_without_a_chat_template_is_refused_in_one_line(chat_package):
    package, _hf = chat_package
    done = chat(package.parent / "plain_pkg", input="w5\n")
    assert done.exit_code == 2
    assert done.stderr.startswith("error: package ") and done.stderr.count("\n") == 1
    assert "carries no chat template; export the model from a saved folder" in done.stderr


def test_a_template_that_escapes_the_sandbox_ends_the_chat_in_one_line(chat_package, tmp_path):
    package, _hf = chat_package
    hostile = with_template(
        package.parent / "plain_pkg", tmp_path / "bad", "{{ ''.__class__.__mro__ }}"
    )
    done = chat(hostile, input="w5\n")
    assert done.exit_code == 7, done.stderr
    assert (
        "its chat template chat_template.jinja was stopped: access to attribute '__class__'"
        in done.stderr
    )
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "template, words",
    [
        ("{% if true %}" * 5000 + "x" + "{% endif %}" * 5000, "was stopped: RecursionError"),
        ("{{ x }}" * 140_000, "was stopped: compiling it ran past 2 s"),  # 980 KB
    ],
    ids=["5000-nested-ifs", "980kb-of-expressions"],
)
def test_a_template_that_cannot_compile_within_its_bounds_ends_the_chat_in_one_line(
    chat_package, tmp_path, monkeypatch, template, words
):
    monkeypatch.setattr("aotc_runtime.template_process.MAX_SECONDS", 2.0)
    package, _hf = chat_package
    hostile = with_template(package.parent / "plain_pkg", tmp_path / "bad", template)
    started = time.perf_counter()
    done = chat(hostile, input="w5\n")
    assert done.exit_code == 7, done.stderr
    assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert time.perf_counter() - started < 10


def test_generate_with_chat_renders_the_prompt_as_a_users_first_turn(chat_package, tmp_path):
    """`aotc generate --chat`: the prompt transformers' apply_chat_template makes of one user
    message, greedy, and the same reply `aotc chat` gives; without a template, one line."""
    import json

    package, hf = chat_package
    done = invoke("generate", package, "--prompt", "w5 w17", "--chat", "--max-new-tokens", NEW,
                  "--json")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    ids = hf.apply_chat_template(
        [{"role": "user", "content": "w5 w17"}], chat_template=CHATML, tokenize=True,
        add_generation_prompt=True, return_dict=False,
    )  # fmt: skip
    expected = aotc_runtime.load(package).generate([ids], max_new_tokens=NEW)[0, len(ids) :]
    assert json.loads(done.stdout)["generated_ids"] == [expected.tolist()]
    plain = tmp_path / "plain"
    shutil.copytree(package, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["generation"]["chat_template"] = None
    (plain / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    refused = invoke("generate", plain, "--prompt", "w5", "--chat")
    assert refused.exit_code == 2 and "--chat needs a chat template" in refused.stderr
    assert "Traceback" not in refused.stderr
    ids_only = invoke("generate", package, "--prompt-ids", "5,17", "--chat")
    assert ids_only.exit_code == 2 and "--chat renders --prompt text" in ids_only.stderr


def test_verbose_chat_says_each_replys_tokens_speed_and_context(chat_package):
    """`aotc --verbose chat`: after each reply one line with its tokens, its speed and the
    context used (this reply has no end-of-sequence id in its first NEW tokens: NEW of them)."""
    import re

    from click.testing import CliRunner

    from aotc.cli.main import cli

    package, hf = chat_package
    args = ["--verbose", "chat", str(package), "--max-new-tokens", str(NEW)]
    done = CliRunner().invoke(cli, args, input="w5 w17\n/exit\n", catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    ids = hf.apply_chat_template(
        [{"role": "user", "content": "w5 w17"}], chat_template=CHATML, tokenize=True,
        add_generation_prompt=True, return_dict=False,
    )  # fmt: skip
    used = len(ids) + NEW
    line = f"context {used} of {MAX_LEN} positions, {100 * used / MAX_LEN:.0f}%)"
    assert re.search(rf"\({NEW} tokens; first after \d+ ms, .*; {re.escape(line)}", done.stderr)
    plain = chat(package, "--max-new-tokens", NEW, input="w5 w17\n/exit\n")
    assert "tokens; first after" not in plain.stderr
