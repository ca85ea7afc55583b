"""The chat template renderer (aotc_runtime.chat_template): the prompt transformers'
`apply_chat_template` makes, token for token, and what an untrusted template or bad messages get."""

from __future__ import annotations

import pytest

from aotc_runtime import GenerationInputError, PackageError
from aotc_runtime.chat_template import ChatTemplate

# SmolLM2-Instruct's template (ChatML, with its default system message)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# transformers' extras: the bos_token variable, tojson, raise_exception, {% generation %}, loop controls
EXTRAS = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{% continue %}{% endif %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
    "{% else %}[{{ m['role'] | upper }}] {{ m['content'] | trim }}\n{% endif %}"
    "{% if loop.index > 50 %}{% break %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Héllo 🙂, how are you?"},
        {"role": "assistant", "content": 'Fine, "thanks" <b>!</b>'},
        {"role": "user", "content": "  And now?\n"},
    ],
]


@pytest.fixture(scope="module")
def tokenizers():
    """A byte-level BPE tokenizer (every byte a token) with ChatML's special tokens, as
    `tokenizers` and as transformers' fast tokenizer over it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    return tokenizer, hf


@pytest.mark.parametrize("template", [CHATML, EXTRAS], ids=["chatml", "extras"])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "system-and-turns"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_prompt_equals_transformers_apply_chat_template(
    tokenizers, template, messages, add_generation_prompt
):
    tokenizer, hf = tokenizers
    ours = ChatTemplate(template, hf.special_tokens_map)
    theirs = hf.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
    )
    assert ours.prompt_ids(tokenizer, messages, add_generation_prompt) == theirs
    assert ours.render(messages, add_generation_prompt) == hf.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


@pytest.mark.parametrize(
    "template, reason",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "attribute '__class__' of 'str' object is unsafe"),
        ("{{ cycler.__init__.__globals__.os }}", "attribute '__init__'"),
        ("{{ messages.append(1) }}", "attribute 'append' of 'list' object is unsafe"),
        ("{{ 'x' * 10**10 }}", "a repeat (*) would make 10,000,000,000 characters"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}{{ ns.s }}", "a joined string would make"),
        ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "the rendered prompt passed"),
        ("{{ 'a'.center(1000000000) }}", "center() was given 1,000,000,000"),
        ("{{ '%999999999d' % 1 }}", "a % format has a format width above"),
        ("{{ ('ab' * 2000000) | replace('a', 'aaaa') }}", "the replace filter would make"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
         "the render ran past"),
    ],
)  # fmt: skip
def test_a_template_that_escapes_the_sandbox_or_its_bounds_is_refused(
    monkeypatch, template, reason
):
    monkeypatch.setattr("aotc_runtime.template_process.MAX_SECONDS", 1.0)
    with pytest.raises(PackageError) as caught:
        ChatTemplate(template).render(CONVERSATIONS[0])
    message = str(caught.value)
    assert "\n" not in message and reason in message and "was stopped" in message
    assert message.endswith("(aotc export MODEL_DIR --task text-generation)")


def test_a_template_that_is_not_jinja_is_refused():
    with pytest.raises(PackageError, match=r"is not a Jinja template \(line 1: "):
        ChatTemplate("{% for m in messages %}{{ m }")


def test_the_templates_own_refusal_is_the_messages_problem():
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('start with a user message') }}{% endif %}"
    with pytest.raises(
        GenerationInputError, match="refuses these messages: start with a user message$"
    ):
        ChatTemplate(template).render([{"role": "assistant", "content": "hi"}])


@pytest.mark.parametrize(
    "messages, problem",
    [
        ("hello", "the messages are a str"),
        ([], "the messages are a list"),
        ([{"role": "user"}], "message 0 has no text 'content' (it is missing)"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}],
         "message 1 has no text 'content' (it is a int)"),
        ([{"content": "a"}], "message 0 has no text 'role'"),
        (["hi"], "message 0 is a str"),
        ([{"role": "user", "content": "x" * (1 << 20 + 1)}], "above the 1,048,576 a chat may hold"),
    ],
)  # fmt: skip
def test_bad_messages_are_refused_in_one_line(messages, problem):
    with pytest.raises(GenerationInputError) as caught:
        ChatTemplate(CHATML).render(messages)
    assert problem in str(caught.value) and "\n" not in str(caught.value)


# One call that builds a huge value before any size can be checked, or loops inside a Jinja
# builtin where no template line runs: each was seen to take gigabytes or a minute in the caller.
BUILT_IN_ONE_CALL = "{% set s = 'x' * 4000000 %}"
OVERSTEPPING = [
    BUILT_IN_ONE_CALL + "{{ [s] * 1000 }}",
    BUILT_IN_ONE_CALL + "{{ ([s] * 1000) | string }}",
    BUILT_IN_ONE_CALL + "{{ ([s] * 1000) | tojson }}",
    BUILT_IN_ONE_CALL + "{{ ([s] * 1000) | pprint }}",
    BUILT_IN_ONE_CALL + "{{ ([s] * 1000) ~ '' }}",
    BUILT_IN_ONE_CALL + "{{ '%s' % ([s] * 1000) }}",
    BUILT_IN_ONE_CALL + "{{ ([s] * 1000) | map('upper') | list | length }}",
    BUILT_IN_ONE_CALL + "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
    "{% set ns.l = ns.l + [s ~ i] %}{% endfor %}{{ ns.l | length }}",
    "{{ ([[1]] * 4000000) | sum(start=[]) }}",
]
_MEASURED_RENDER = """
import json, resource, sys, time
from aotc_runtime import template_process
from aotc_runtime.chat_template import ChatTemplate
template_process.MAX_SECONDS = 2.0
started = time.perf_counter()
try:
    ChatTemplate(sys.argv[1]).render([{"role": "user", "content": "hi"}])
    outcome = "rendered"
except Exception as exc:
    outcome = f"{type(exc).__name__}: {exc}"
# VmHWM: this process's peak since its exec (ru_maxrss would count the forked pytest before it)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - started,
                  "caller_mib": int(peak.split()[1]) / 1024, "worker_mib": worker / 1024}))
"""


@pytest.mark.parametrize("template", OVERSTEPPING, ids=range(len(OVERSTEPPING)))
def test_a_template_that_builds_or_loops_in_one_call_is_stopped_in_bounded_memory_and_time(
    template,
):
    """The render's process is capped (template_worker.MAX_ADDRESS_SPACE) and killed at its
    deadline: the caller's peak stays that of a small Python, whatever the template does."""
    import json
    import subprocess
    import sys

    from aotc_runtime.template_worker import MAX_ADDRESS_SPACE

    done = subprocess.run([sys.executable, "-c", _MEASURED_RENDER, template],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    measured = json.loads(done.stdout)
    outcome = measured["outcome"]
    assert outcome.startswith("PackageError: the chat template was stopped: "), outcome
    assert "MemoryError" in outcome or "the render ran past 2 s" in outcome, outcome
    assert measured["caller_mib"] < 128 and measured["seconds"] < 5, measured
    assert measured["worker_mib"] < MAX_ADDRESS_SPACE / (1 << 20), measured


def test_lipsum_is_not_offered_and_a_stopped_template_renders_again():
    template = ChatTemplate(
        "{% if messages[0]['content'] == 'loop' %}{{ lipsum(200, False, 65535, 65536) }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )
    with pytest.raises(GenerationInputError, match="'lipsum' is undefined$"):
        template.render([{"role": "user", "content": "loop"}])
    assert template.render([{"role": "user", "content": "hi"}]) == "hi"
    template.close()


def test_a_worker_killed_between_renders_is_started_again():
    import os
    import signal

    template = ChatTemplate("{{ messages[0]['content'] }}")
    worker = template._process.pid()
    os.kill(worker, signal.SIGKILL)
    os.waitid(os.P_PID, worker, os.WEXITED | os.WNOWAIT)  # gone (left for the render to reap)
    assert template.render([{"role": "user", "content": "again"}]) == "again"
    template.close()


_ORPHANED_RENDER = """
import sys
from aotc_runtime import template_process
from aotc_runtime.chat_template import ChatTemplate
template_process.MAX_SECONDS = 2.0
template = ChatTemplate("{{ ([[1]] * 4000000) | sum(start=[]) }}")
print(template._process.pid(), flush=True)
template.render([{"role": "user", "content": "hi"}])
"""


def test_a_worker_whose_caller_dies_mid_render_ends_itself():
    """Its caller killed (SIGKILL: nothing of it runs) while the worker loops inside one builtin:
    the worker ends itself a little after the deadline, instead of spinning on for hours."""
    import os
    import subprocess
    import sys
    import time

    caller = subprocess.Popen([sys.executable, "-c", _ORPHANED_RENDER], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    worker = int(caller.stdout.readline())
    time.sleep(0.5)  # the render has started
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)  # still there (an orphan is reaped by init once it ends)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(worker, 9)
    raise AssertionError("the orphaned worker was still rendering 15 s after its caller died")
