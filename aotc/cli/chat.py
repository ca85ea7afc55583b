"""`aotc chat`: an interactive chat in the terminal with a text-generation package that carries a
chat template (aotc_runtime.chat_session.ChatSession): a line in, the reply streamed as text."""

from __future__ import annotations

from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.sampling_options import sampling_options, with_model_defaults
from aotc.cli.types import exit_codes_epilog, threads_option
from aotc.errors import UserInputError
from aotc.quiet import verbose

PROMPT = "> "
COMMANDS = "/reset clears the history, /exit (or Ctrl-D) leaves, /help lists these"


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@sampling_options(model_defaults=True)
@threads_option(
    "CPU threads of each step (1 to 1024) [default: one per physical core this process may use]."
)
@signature_options
def chat(
    package,
    system,
    max_new_tokens,
    sampling,
    threads,
    require_signature,
    public_key,
):
    """Chat with PACKAGE in the terminal: type a message, the reply streams as it comes.

    \b
    The package needs a tokenizer and a chat template: export it from a saved model folder
    that has them (aotc export MODEL_DIR --task text-generation). /reset clears the history,
    /exit or Ctrl-D leaves, /help lists these. When the history no longer fits the package's
    --max-seq-len, the oldest turns are dropped, and a line on stderr says so; so does a reply
    that stopped at --max-new-tokens. A turn is fed only what follows the conversation so far,
    which the package's KV cache still holds. The sampling options left out take the model's
    defaults (its generation_config; greedy when it does not sample), as aotc serve does.

    \b
      aotc chat lm_pkg/ --system "You are concise." --max-new-tokens 128
    """
    import aotc_runtime
    from aotc_runtime.chat_session import ChatSession
    from aotc_runtime.chat_template import ChatTemplate
    from aotc_runtime.threads import set_threads

    public_key = required_key(require_signature, public_key)
    threads = set_threads(threads)  # before the package loads: inter-op threads are set once
    loaded = aotc_runtime.load(package, public_key=public_key)
    template = ChatTemplate.of_package(loaded)
    if template is None:
        raise UserInputError(
            f"package {package} carries no chat template; export the model from a saved folder "
            "that has one (chat_template.jinja, or tokenizer_config.json's chat_template): "
            f"aotc export MODEL_DIR --task text-generation, then aotc build; or run "
            f'`aotc generate {package} --prompt "TEXT"` for plain text'
        )
    session = ChatSession(
        loaded,
        template,
        system=system,
        max_new_tokens=max_new_tokens,
        **with_model_defaults(loaded.generation, sampling),
    )
    converse(session, threads)


def reply_stats(session, started: float, stamps: list) -> str:
    """`aotc --verbose chat`'s line after a reply: its tokens and speed, and the context used."""
    made, length = session.made, session.package.generation.max_seq_len
    first = (stamps[0] - started) * 1000 if stamps else float("nan")
    rate = (
        (made - 1) / (stamps[-1] - stamps[0])
        if len(stamps) > 1 and stamps[-1] > stamps[0]
        else None
    )
    speed = f"{rate:.1f} tokens/s after the first" if rate else "one piece"
    used = session.prompt_tokens + made
    return (
        f"({made} tokens; first after {first:.0f} ms, {speed}; context {used} of {length} "
        f"positions, {100 * used / length:.0f}%)"
    )


def converse(session, threads: int | None = None) -> None:
    """Read a line, stream its reply, until /exit or the end of input. The first reply whose
    pieces came with stalls (aotc_runtime.timing.stall_note) is followed by a note that says so."""
    import sys
    import time

    from aotc_runtime import GenerationInputError
    from aotc_runtime.timing import gaps_ms, stall_note

    noted = False

    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    interactive = sys.stdin.isatty()
    click.echo(f"chatting with {session.package.path} ({COMMANDS})", err=True)
    while True:
        try:
            line = input(PROMPT if interactive else "")
        except EOFError:
            click.echo(err=True)
            return
        text = line.strip()
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            session.reset()
            click.echo("(history cleared)", err=True)
            continue
        if text == "/help":
            click.echo(f"({COMMANDS})", err=True)
            continue
        if not text:
            continue
        try:
            replying = session.reply(line)
        except GenerationInputError as exc:  # this message only: the chat goes on
            click.echo(f"error: {exc}", err=True)
            continue
        if session.dropped:
            click.echo(
                f"(dropped the oldest {session.dropped} turn{'s' if session.dropped > 1 else ''}: "
                f"the history no longer fits the package's "
                f"{session.package.generation.max_seq_len}-token cache)",
                err=True,
            )
        stamps = []
        started = time.perf_counter()
        try:
            for piece in replying:
                click.echo(piece, nl=False)  # echo flushes: the reply shows as it comes
                stamps.append(time.perf_counter())
        except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
            replying.close()
            click.echo("\n(reply stopped; not kept in the history)", err=True)
            continue
        click.echo()
        if session.cut:
            click.echo(
                f"(the reply stopped at --max-new-tokens {session.max_new_tokens}; raise it for "
                "longer replies)",
                err=True,
            )
        if verbose():
            click.echo(reply_stats(session, started, stamps), err=True)
        note = None if noted else stall_note(gaps_ms(stamps), threads)
        if note:
            click.echo(note, err=True)
            noted = True
