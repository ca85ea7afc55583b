"""Sampling controls beyond temperature, top-k and top-p (runtime/aotc_runtime/sampling.py), and
log-probabilities, each held to its reference:

- min-p and the repetition penalty to transformers' `MinPLogitsWarper` and
  `RepetitionPenaltyLogitsProcessor`: greedy tokens equal to transformers' `generate`, and seeded
  tokens equal to a reference loop over the eager model that applies transformers' processors and
  then draws with the runtime's counter-based random numbers (test_sampling.py holds those to
  splitmix64 and the draw to softmax's probabilities);
- the presence and frequency penalties to OpenAI's definition, by hand in the same loop;
- log-probabilities to the log-softmax of the package's own logits, replayed step by step;
- rows independent in a running batch that mixes greedy, sampled, penalized and logprob rows.

The conftest's GPT-2 generation package: batch 2, a 32-token cache, built once per session."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import invoke

import aotc_runtime
from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.decode_step import pack
from aotc_runtime.errors import GenerationInputError
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation import prefill_inputs
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling import GREEDY, RowSampler, Sampling, uniforms

pytestmark = pytest.mark.slow

# two prompts of one length: transformers' repetition penalty counts padding as prompt tokens
PROMPTS = [[5, 17, 42, 9, 100, 7, 3], [7, 8, 300, 4, 9, 11, 250]]
NEW = 12


@pytest.fixture(scope="module")
def gpt2(generation_packages):
    package, model = generation_packages["gpt2"]
    return aotc_runtime.load(package), model, package


def draw(scores: torch.Tensor, seed: int, count: int) -> int:
    """The runtime's inverse-CDF draw (sampling.RowSampler.choose) of one row's `count`-th
    token from its processed scores [1, vocab]."""
    running = scores.softmax(dim=-1).cumsum(dim=-1)
    total = running[:, -1:]
    below = torch.nextafter(total, torch.zeros_like(total))
    signed = seed - 2**64 if seed >= 2**63 else seed  # the seed's 64 bits, as an int64
    number = uniforms(torch.tensor([signed]), torch.tensor([count]))[:, None]
    target = torch.minimum(number * total, below)
    return int(torch.searchsorted(running, target, right=True))


def reference(model, prompt: list, new: int, sampling: Sampling, seen=None) -> list:
    """A row's tokens from the eager model (or, given `seen`, from the logits the package's sampler
    was handed at each step, row 0): transformers' processors in `generate`'s order
    (repetition penalty; temperature, top-k, top-p, min-p), OpenAI's presence and frequency
    penalties over the new tokens after the repetition penalty (as vLLM applies them), then
    argmax or the runtime's draw."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    ids = torch.tensor([prompt])
    made: list = []
    for count in range(new):
        if seen is not None:
            scores = seen[count][None, :].float()
        else:
            with torch.no_grad():
                scores = model(ids).logits[:, -1, :].float()
        if sampling.repetition_penalty != 1:
            scores = RepetitionPenaltyLogitsProcessor(float(sampling.repetition_penalty))(
                ids, scores
            )
        counts = torch.bincount(torch.tensor(made, dtype=torch.long), minlength=scores.shape[-1])
        scores = (
            scores - sampling.frequency_penalty * counts - sampling.presence_penalty * (counts > 0)
        )
        if sampling.greedy:
            token = int(scores.argmax(-1))
        else:
            warpers = [TemperatureLogitsWarper(float(sampling.temperature))]
            if sampling.top_k is not None:
                warpers.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p is not None:
                warpers.append(TopPLogitsWarper(sampling.top_p))
            if sampling.min_p:
                warpers.append(MinPLogitsWarper(sampling.min_p))
            for warper in warpers:
                scores = warper(ids, scores)
            token = draw(scores, sampling.seed or 0, count)
        made.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return made


def generated(loaded, prompt: list, new: int, sampling: Sampling, **options) -> list:
    out = loaded.generate(
        torch.tensor([prompt]),
        max_new_tokens=new,
        eos_token_ids=[],
        **{f: getattr(sampling, f) for f in Sampling.__dataclass_fields__},
        **options,
    )
    return out[0, len(prompt) :].tolist()


def test_greedy_with_a_repetition_penalty_equals_transformers_generate(gpt2):
    loaded, model, _ = gpt2
    ids = torch.tensor(PROMPTS)
    with torch.no_grad():
        expected = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            repetition_penalty=1.5,
            pad_token_id=0,
        )
    got = loaded.generate(ids, max_new_tokens=NEW, eos_token_ids=[], repetition_penalty=1.5)
    assert got.tolist() == expected.tolist()
    plain = loaded.generate(ids, max_new_tokens=NEW, eos_token_ids=[])
    assert got.tolist() != plain.tolist(), "the penalty changed nothing: the test tests nothing"


CASES = {
    "min-p": Sampling(temperature=0.9, min_p=0.2, seed=5),
    "top-k, top-p, min-p": Sampling(temperature=1.2, top_k=40, top_p=0.9, min_p=0.1, seed=11),
    "repetition, sampled": Sampling(temperature=0.8, repetition_penalty=1.4, seed=3),
    "presence and frequency, sampled": Sampling(
        temperature=0.8, presence_penalty=1.5, frequency_penalty=0.7, seed=9
    ),
    "every penalty, greedy": Sampling(
        presence_penalty=-0.5, frequency_penalty=1.1, repetition_penalty=1.2
    ),
    "every control": Sampling(
        temperature=0.7,
        top_k=50,
        top_p=0.95,
        min_p=0.05,
        seed=2**64 - 1,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        repetition_penalty=0.8,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_seeded_tokens_equal_the_reference_of_transformers_processors(gpt2, case):
    """The processors applied to the logits the sampler was handed: a sampled token depends on
    every bit of its logits, and the package's differ from eager's in their last bits (by the
    threads and kernels that summed them), so the reference replays the package's own."""
    loaded, model, _ = gpt2
    sampling = CASES[case]
    prompt = PROMPTS[0]
    seen: list = []
    call = RowSampler.__call__

    def recording(self, logits, *args, **kwargs):
        seen.append(logits[0].detach().clone())
        return call(self, logits, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RowSampler, "__call__", recording)
        got = generated(loaded, prompt, NEW, sampling)
    assert len(seen) == NEW
    assert got == reference(model, prompt, NEW, sampling, seen)
    # the control changes the tokens: without it, the same seed gives others
    bare = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)
    assert got != generated(loaded, prompt, NEW, bare), "the control changed nothing"


def package_logits(loaded, prompts: list, tokens: torch.Tensor) -> torch.Tensor:
    """[steps, prompts, vocab]: the package's own logits for each step of a generation of
    `tokens` [prompts, steps] after `prompts` (one length), calling its step program directly."""
    ids = torch.tensor(prompts)
    loaded.reset_state()
    steps = [loaded(*prefill_inputs(ids, torch.ones_like(ids)))]
    rows, length = ids.shape
    for step in range(tokens.shape[1] - 1):
        feeds = [(row, length + step, [int(tokens[row, step])]) for row in range(rows)]
        steps.append(loaded(*pack(feeds)))
    loaded.reset_state()
    return torch.stack(steps).float()


@pytest.mark.parametrize(
    "sampling",
    [GREEDY, Sampling(temperature=0.7, top_k=30, repetition_penalty=1.3, seed=4)],
    ids=["greedy", "sampled-and-penalized"],
)
def test_logprobs_are_the_log_softmax_of_the_packages_own_logits(gpt2, sampling):
    """Before penalties and temperature (vLLM's default): a penalized, sampled row's
    log-probabilities are still its raw logits'."""
    loaded, _model, _ = gpt2
    steps = list(
        loaded.stream(
            torch.tensor(PROMPTS),
            max_new_tokens=NEW,
            eos_token_ids=[],
            logprobs=5,
            **{f: getattr(sampling, f) for f in Sampling.__dataclass_fields__},
        )
    )
    tokens = torch.stack([step.tokens for step in steps], 1)
    expected = package_logits(loaded, PROMPTS, tokens).log_softmax(dim=-1)  # [steps, rows, vocab]
    chosen = torch.stack([step.logprobs for step in steps])
    assert torch.allclose(chosen, expected.gather(2, tokens.T[:, :, None]).squeeze(2), atol=1e-5)
    top = expected.topk(5, dim=-1)
    assert torch.allclose(torch.stack([s.top_logprobs for s in steps]), top.values, atol=1e-5)
    assert torch.stack([s.top_ids for s in steps]).tolist() == top.indices.tolist()
    if sampling.greedy:
        assert torch.equal(chosen, top.values[:, :, 0])  # the argmax is the most likely
    assert tokens.tolist() == [generated(loaded, prompt, NEW, sampling) for prompt in PROMPTS], (
        "asking for log-probabilities changed the tokens"
    )


def test_ignore_eos_goes_on_to_max_new_tokens(gpt2):
    loaded, _model, _ = gpt2
    free = generated(loaded, PROMPTS[0], NEW, GREEDY)
    eos = free[3]
    first = free.index(eos)
    stopped = loaded.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=NEW, eos_token_ids=[eos])
    assert stopped[0, 7:].tolist() == free[: first + 1]  # ends at the eos
    ignored = loaded.generate(
        torch.tensor([PROMPTS[0]]), max_new_tokens=NEW, eos_token_ids=[eos], ignore_eos=True
    )
    assert ignored[0, 7:].tolist() == free
    engine = DecodeEngine(loaded)
    engine.join(
        "a", GenerationRequest(tuple(PROMPTS[0]), NEW, eos_token_ids=(eos,), ignore_eos=True)
    )
    made = []
    while engine.active:
        made += engine.step()
    assert [m.token for m in made] == free
    assert [m.finish for m in made] == [None] * (NEW - 1) + [FinishReason.LENGTH]


def alone(loaded, prompt: list, new: int, sampling: Sampling, logprobs: int | None) -> list:
    """(token, logprob, top pairs) of a sequence run alone through `stream`."""
    out = []
    for step in loaded.stream(
        torch.tensor([prompt]),
        max_new_tokens=new,
        eos_token_ids=[],
        logprobs=logprobs,
        **{f: getattr(sampling, f) for f in Sampling.__dataclass_fields__},
    ):
        if logprobs is None:
            out.append((int(step[0]), None, ()))
        else:
            pairs = tuple(zip(step.top_ids[0].tolist(), step.top_logprobs[0].tolist()))
            out.append((int(step.tokens[0]), float(step.logprobs[0]), pairs))
    return out


@pytest.mark.parametrize("overlap", [False, True], ids=["", "step-ahead"])
def test_greedy_sampled_penalized_and_logprob_rows_share_a_running_batch(gpt2, overlap):
    """Each row its own settings, counts and log-probabilities: a row's tokens (and
    log-probabilities) beside others, joining and leaving, are its lone run's; its penalty
    counts start again when a sequence takes a row another left."""
    loaded, _model, _ = gpt2
    hot = Sampling(temperature=0.9, top_k=50, min_p=0.05, presence_penalty=1.0, seed=7)
    plan = {
        0: ("a", PROMPTS[0], 12, hot, 3),
        2: ("b", [7, 8, 300], 5, GREEDY, None),  # greedy beside the penalized, sampled a
        8: ("c", [11, 12, 13, 14], 6, Sampling(repetition_penalty=1.5, frequency_penalty=2), 0),
        15: ("d", [9, 9, 9], 4, Sampling(frequency_penalty=-2.0), None),  # into a penalized row
    }
    engine = DecodeEngine(loaded, overlap=overlap)
    made: dict = {}
    step = 0
    while step == 0 or engine.active or any(at >= step for at in plan):
        if step in plan:
            key, prompt, new, sampling, logprobs = plan[step]
            engine.join(key, GenerationRequest(tuple(prompt), new, sampling, (), logprobs=logprobs))
            made[key] = []
        for m in engine.step():
            made[m.key].append((m.token, m.logprob, m.top_logprobs))
        step += 1
        assert step < 100
    for key, prompt, new, sampling, logprobs in plan.values():
        lone = alone(loaded, prompt, new, sampling, logprobs)
        assert [t for t, _, _ in made[key]] == [t for t, _, _ in lone], key
        if logprobs is None:
            assert all(lp is None and top == () for _, lp, top in made[key]), key
            continue
        for (_, lp, top), (_, lone_lp, lone_top) in zip(made[key], lone):
            assert lp == pytest.approx(lone_lp, abs=1e-5) and len(top) == logprobs, key
            assert [i for i, _ in top] == [i for i, _ in lone_top], key


def test_a_batch_that_asks_for_no_penalties_or_logprobs_does_none_of_that_work(gpt2):
    """The sampler's mode names the work a step does: greedy rows alone stay argmax only, with no
    [rows, vocab] counts made; a penalized or logprob row adds that work while it runs."""
    sampler = RowSampler(2, 50, torch.device("cpu"))
    assert sampler.mode == "greedy" and sampler.counts is None
    sampler.set(1, Sampling(temperature=0.5, seed=1), logprobs=0)
    assert sampler.mode == "sampled+logprobs" and sampler.counts is None
    sampler.set(0, Sampling(repetition_penalty=1.1), prompt=[3, 4])
    assert sampler.mode == "sampled+penalties+logprobs"
    assert sampler.counts is not None and sampler.in_prompt[0].nonzero().flatten().tolist() == [
        3,
        4,
    ]
    sampler.set(1, Sampling(temperature=0.5, min_p=0.1, seed=1))
    assert sampler.mode == "filtered+penalties"
    sampler.set(0, GREEDY)
    sampler.set(1, GREEDY)
    assert sampler.mode == "greedy"
    loaded, _model, _ = gpt2
    engine = DecodeEngine(loaded)
    engine.join("a", GenerationRequest((5, 6, 7), 3, GREEDY, ()))
    while engine.active:
        engine.step()
    assert engine.sampler.mode == "greedy" and engine.sampler.counts is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"min_p": 1.5}, r"^min-p 1\.5 is outside \[0, 1\]"),
        ({"min_p": float("nan")}, r"^min-p nan is outside"),
        ({"presence_penalty": 2.5}, r"^presence penalty 2\.5 is outside \[-2, 2\]"),
        ({"frequency_penalty": -3}, r"^frequency penalty -3 is outside \[-2, 2\]"),
        ({"frequency_penalty": True}, r"^frequency penalty True is outside"),
        ({"repetition_penalty": 0}, r"^repetition penalty 0 is outside \[0\.01, 100\]"),
        ({"repetition_penalty": float("inf")}, r"^repetition penalty inf is outside"),
        ({"logprobs": 21}, r"^logprobs 21 is not a whole number from 0 to 20"),
        ({"logprobs": -1}, r"^logprobs -1 is not a whole number from 0 to 20"),
    ],
)
def test_values_outside_their_ranges_are_refused_in_one_line(gpt2, options, message):
    loaded, _model, _ = gpt2
    call = loaded.stream if "logprobs" in options else loaded.generate
    with pytest.raises(GenerationInputError, match=message):
        list(call(torch.tensor([[5, 6]]), max_new_tokens=2, **options))
    # the engine's requests cannot hold such a value: the Sampling or the request is refused
    # when it is made, in the same words
    with pytest.raises(GenerationInputError, match=message):
        GenerationRequest(
            (5, 6),
            2,
            Sampling(**{k: v for k, v in options.items() if k != "logprobs"}),
            logprobs=options.get("logprobs"),
        )
    # the edges run
    edges = dict(temperature=1.0, min_p=1.0, presence_penalty=-2, frequency_penalty=2,
                 repetition_penalty=100, seed=0)  # fmt: skip
    assert loaded.generate(torch.tensor([[5, 6]]), max_new_tokens=2, **edges).shape == (1, 4)
    Sampling(min_p=0, repetition_penalty=0.01)  # made: within the ranges


def test_the_generate_command_takes_the_controls_and_prints_logprobs_in_json(gpt2):
    loaded, _model, package = gpt2
    flags = ["--max-new-tokens", 6, "--temperature", 0.8, "--seed", 3, "--min-p", 0.05,
             "--presence-penalty", 0.5, "--frequency-penalty", 0.25, "--repetition-penalty", 1.3]  # fmt: skip
    done = invoke("generate", package, "--prompt-ids", "5,17,42", *flags, "--json", "--logprobs", 2)
    assert done.exit_code == 0, done.stderr
    report = json.loads(done.stdout)
    sampling = Sampling(0.8, None, None, 3, min_p=0.05, presence_penalty=0.5,
                        frequency_penalty=0.25, repetition_penalty=1.3)  # fmt: skip
    lone = alone(loaded, [5, 17, 42], 6, sampling, 2)
    assert report["generated_ids"] == [[t for t, _, _ in lone]]
    entries = report["logprobs"][0]
    assert [e["token_id"] for e in entries] == report["generated_ids"][0]
    for entry, (_, lp, top) in zip(entries, lone):
        assert entry["logprob"] == pytest.approx(lp, abs=1e-5)
        assert [t["token_id"] for t in entry["top_logprobs"]] == [i for i, _ in top[:2]]
    # the package's end-of-sequence ids (none inside this tiny vocabulary) are passed over
    free = loaded.generate(torch.tensor([[5, 17, 42]]), max_new_tokens=6, ignore_eos=True)
    ignored = invoke("generate", package, "--prompt-ids", "5,17,42", "--max-new-tokens", 6,
                     "--ignore-eos", "--json")  # fmt: skip
    assert ignored.exit_code == 0, ignored.stderr
    assert json.loads(ignored.stdout)["generated_ids"] == [free[0, 3:].tolist()]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-p", "1.5"], "min-p 1.5 is outside [0, 1]"),
        (["--repetition-penalty", "0"], "repetition penalty 0.0 is outside [0.01, 100]"),
        (["--presence-penalty", "nan"], "presence penalty nan is outside [-2, 2]"),
        (["--logprobs", "2"], "--logprobs is printed in the JSON result; add --json"),
        (["--logprobs", "21", "--json"], "21 is not in the range 0<=x<=20"),
    ],
)
def test_the_generate_command_refuses_bad_controls_in_one_line(gpt2, flags, message):
    _loaded, _model, package = gpt2
    done = invoke("generate", package, "--prompt-ids", "5,17,42", "--max-new-tokens", 4, *flags)
    assert done.exit_code == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def cuda_gpt2(tmp_path_factory):
    """The conftest's GPT-2 generation model built for CUDA with reduce-overhead: its decode
    step, sampler included, replays as CUDA graphs (a graph per sampler mode)."""
    from conftest import GENERATION_MODEL_FILE, ZOO, load_model_file

    work = tmp_path_factory.mktemp("controls_gpu")
    source, artifact, package = work / "gpt2_lm.py", work / "gpt2.pt2", work / "gpt2_pkg"
    source.write_text(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / "gpt2.py")))
    done = invoke("export", source, "--task", "text-generation", "--max-seq-len", 32,
                  "--batch-size", 2, "-o", artifact)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    done = invoke("build", artifact, "--device", "cuda", "--mode", "reduce-overhead",
                  "-o", package, "--quiet")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    return aotc_runtime.load(package), load_model_file(source).cuda()


@pytest.mark.gpu
def test_penalized_and_logprob_rows_replay_their_own_cuda_graphs(cuda_gpt2):
    """On CUDA a batch with penalized and logprob rows replays a graph of its mode, with the
    counts and log-probabilities as the sampler's buffers: greedy tokens with a repetition
    penalty equal transformers' `generate` on the GPU, log-probabilities equal the log-softmax of
    the package's own logits, and mixed rows in a running batch equal their lone runs."""
    loaded, model = cuda_gpt2
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        ids = torch.tensor(PROMPTS)
        with torch.no_grad():
            expected = model.generate(ids.cuda(), attention_mask=torch.ones_like(ids).cuda(),
                                      max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                      repetition_penalty=1.5, pad_token_id=0).cpu()  # fmt: skip
        got = loaded.generate(ids, max_new_tokens=NEW, eos_token_ids=[], repetition_penalty=1.5)
        assert got.tolist() == expected.tolist()
        assert "greedy+penalties" in loaded.decode_graph().captured_modes

        sampled = Sampling(temperature=0.7, top_k=30, min_p=0.05, repetition_penalty=1.3, seed=4)
        fields = {f: getattr(sampled, f) for f in Sampling.__dataclass_fields__}
        steps = list(loaded.stream(ids, max_new_tokens=NEW, eos_token_ids=[], logprobs=5, **fields))
        tokens = torch.stack([step.tokens for step in steps], 1)
        logits = package_logits(loaded, PROMPTS, tokens.cuda()).cpu().log_softmax(dim=-1)
        chosen = torch.stack([step.logprobs for step in steps])
        assert torch.allclose(chosen, logits.gather(2, tokens.T[:, :, None]).squeeze(2), atol=1e-4)
        top = logits.topk(5, dim=-1)
        assert torch.allclose(torch.stack([s.top_logprobs for s in steps]), top.values, atol=1e-4)
        assert "filtered+penalties+logprobs" in loaded.decode_graph().captured_modes

        hot = Sampling(temperature=0.9, top_k=50, presence_penalty=1.0, seed=7)
        plan = {
            0: ("a", PROMPTS[0], 12, hot, 3),
            2: ("b", [7, 8, 300], 5, GREEDY, None),
            8: ("c", [11, 12, 13, 14], 6, Sampling(frequency_penalty=2), 0),
        }
        engine = DecodeEngine(loaded)
        made: dict = {}
        step = 0
        while step == 0 or engine.active or any(at >= step for at in plan):
            if step in plan:
                key, prompt, new, sampling, logprobs = plan[step]
                engine.join(
                    key, GenerationRequest(tuple(prompt), new, sampling, (), logprobs=logprobs)
                )
                made[key] = []
            for m in engine.step():
                made[m.key].append((m.token, m.logprob))
            step += 1
        for key, prompt, new, sampling, logprobs in plan.values():
            lone = alone(loaded, prompt, new, sampling, logprobs)
            assert [t for t, _ in made[key]] == [t for t, _, _ in lone], key
            if logprobs is not None:
                assert [lp for _, lp in made[key]] == pytest.approx(
                    [lp for _, lp, _ in lone], abs=1e-5
                )
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
