"""Output held to a grammar: a JSON schema, or a Lark grammar (tool calls), turned into a mask of the
tokens each step may pick, per row. The decode engine asks a row's `TokenMatcher` for its mask
before the step, the sampler sets every other token's logit to -inf (sampling.RowSampler, mode
"+masked"), and the matcher takes the token picked: so whatever the model's logits, a constrained
row's text parses, unless it is cut at its last token.

The grammar engine is llguidance (Microsoft's, Rust; vLLM, SGLang and llama.cpp use it too),
chosen over xgrammar and outlines-core because:
- it needs no other package (xgrammar pulls triton, transformers and a TVM runtime);
- it computes a mask without compiling the grammar against the whole vocabulary first (outlines-core
  builds an index that grows with the schema, and can explode on a crafted one);
- it bounds its own work: the fuel and item limits below stop a crafted schema or grammar at build
  and at every step (LLParserLimits), which is what an untrusted HTTP body needs.

A grammar is checked once, when it is made (`Vocabulary.json_schema`, `Vocabulary.lark`): a bad or
oversized one is a GrammarError naming the problem. One `TokenGrammar` serves any number of rows;
each row takes its own matcher. The mask format is llguidance's: bit t of int32 word t // 32 is set
when token t is allowed, so a row is (vocab + 31) // 32 words.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from .errors import GenerationInputError, MissingDependencyError

# The largest schema or grammar text taken: real ones (OpenAI's structured outputs, tool lists) are
# a few KiB
MAX_GRAMMAR_BYTES = 64 << 10
# llguidance's work limits, below its defaults where a request body sets the grammar: building the
# lexer (~50k fuel a millisecond: at most ~20 ms), each step's mask (~14k a millisecond: at most ~7
# ms), Earley items a step, lexer states (1-2 kB each: at most ~100 MB), and the grammar's size
LIMITS = {
    "max_items_in_row": 2_000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 100_000,
    "step_max_items": 50_000,
    "max_lexer_states": 50_000,
    "max_grammar_size": 200_000,
}
# JSON as people and models write it on one line (Python's json.dumps): no free whitespace, which a
# weak model can otherwise fill a whole answer with
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
INSTALL = "pip install 'aotc-runtime[structured]' (llguidance)"


class GrammarError(GenerationInputError):
    """A schema or grammar that cannot constrain generation: malformed, unsupported, or above the
    limits on its size and work."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise MissingDependencyError(
            f"structured output (JSON schemas, tool calls) needs llguidance: {INSTALL}"
        ) from None
    return llguidance


class Vocabulary:
    """A package's tokenizer as the grammar engine reads it: each token's bytes, and the
    end-of-sequence ids a finished grammar allows. Making one takes about half a second for a
    50k-token vocabulary, so a server makes one per package and keeps it."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple):
        """`tokenizer`: the package's tokenizers.Tokenizer; `vocab_size`: the model's logits'
        width (it may exceed the tokenizer's: the ids past it are never allowed)."""
        llguidance = _llguidance()
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._limits = llguidance.LLParserLimits(**LIMITS)
        # an end-of-sequence id the tokenizer does not hold cannot end a grammar (llguidance
        # refuses it); the tokenizer's own end then does, and a complete grammar ends its row
        words = tokenizer.get_vocab_size(with_added_tokens=True)
        eos = [token for token in eos_token_ids if token < words] or None
        self._tokenizer = _readable(llguidance, tokenizer, vocab_size, eos)

    def json_schema(self, schema: Any) -> TokenGrammar:
        """The grammar of JSON text valid against `schema` (a JSON schema as a dict): an object
        for {"type": "object"} alone, as OpenAI's json_object mode asks."""
        text = _bounded_json(schema, "the JSON schema")
        llguidance = _llguidance()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid: {_one_line(exc)}") from None
        return self._checked(grammar, "the JSON schema")

    def lark(self, text: str) -> TokenGrammar:
        """The grammar of a Lark text in llguidance's dialect (which may hold `%json {...}`)."""
        if len(text.encode()) > MAX_GRAMMAR_BYTES:
            raise GrammarError(
                f"the grammar is {len(text.encode()):,} bytes, above the {MAX_GRAMMAR_BYTES:,} "
                "taken; send a smaller one"
            )
        return self._checked(_llguidance().LLMatcher.grammar_from_lark(text), "the grammar")

    def _checked(self, grammar: str, what: str) -> TokenGrammar:
        """The grammar, built once under the limits (llguidance drops the GIL while it builds)."""
        llguidance = _llguidance()
        problem = llguidance.LLMatcher.validate_grammar(
            grammar, self._tokenizer, limits=self._limits
        )
        if problem and not problem.startswith("WARNING"):
            raise GrammarError(f"{what} cannot constrain generation: {_one_line(problem)}")
        return TokenGrammar(self, grammar)

    def matcher(self, grammar: str) -> TokenMatcher:
        llguidance = _llguidance()
        return TokenMatcher(
            llguidance.LLMatcher(self._tokenizer, grammar, limits=self._limits, log_level=0)
        )


def _readable(llguidance: Any, tokenizer: Any, vocab_size: int, eos: list | None) -> Any:
    """llguidance's tokenizer, its bytes of each token checked against the tokenizer's own text.
    llguidance reads a token's bytes by the decoder's type: a byte-level tokenizer whose decoder
    is a Sequence (transformers writes ByteFallback, Fuse, Replace and ByteLevel for some GGUF
    models, SmolLM2's among them) is read as text, so "Ġ" stays two bytes, and a mask allows a
    token the matcher then refuses. Such a tokenizer is read with its ByteLevel decoder alone,
    which is what its other steps amount to for byte-level tokens."""
    text = tokenizer.to_str()
    made = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
    if _reads_as_its_tokenizer(made, tokenizer):
        return made
    spec = json.loads(text)
    byte_level = [
        step
        for step in [spec.get("decoder") or {}, *(spec.get("decoder") or {}).get("decoders", [])]
        if step.get("type") == "ByteLevel"
    ]
    if byte_level:
        spec["decoder"] = byte_level[0]
        made = llguidance.LLTokenizer(json.dumps(spec), n_vocab=vocab_size, eos_token=eos)
        if _reads_as_its_tokenizer(made, tokenizer):
            return made
    raise GrammarError(
        "this package's tokenizer cannot be read token by token as bytes (its decoder is "
        f"{(spec.get('decoder') or {}).get('type')!r}), so no grammar can hold its output; "
        "structured output needs a byte-level or SentencePiece tokenizer"
    )


# tokens compared in `_reads_as_its_tokenizer`: spread over the vocabulary, a few milliseconds
SAMPLED_TOKENS = 4096


def _reads_as_its_tokenizer(made: Any, tokenizer: Any) -> bool:
    """Whether llguidance's bytes of a spread of tokens are the tokenizer's own decoding, but for
    a leading space (tokens that are not whole UTF-8 alone, and special tokens, are left out)."""
    words = tokenizer.get_vocab_size(with_added_tokens=False)
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    for token in range(0, words, max(1, words // SAMPLED_TOKENS)):
        text = tokenizer.decode([token], skip_special_tokens=False)
        if not text or "\ufffd" in text or text in special:
            continue
        # a SentencePiece token alone decodes without its leading space ("▁The" -> "The")
        if made.decode_bytes([token]).lstrip(b" ") != text.encode().lstrip(b" "):
            return False
    return True


class TokenGrammar:
    """One checked grammar for one vocabulary: rows constrained by it each take a `matcher()`."""

    def __init__(self, vocabulary: Vocabulary, grammar: str):
        self.vocabulary, self._grammar = vocabulary, grammar

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.vocab_size

    def matcher(self) -> TokenMatcher:
        return self.vocabulary.matcher(self._grammar)


class TokenMatcher:
    """Where one row stands in its grammar: the tokens it may pick next, and the tokens it took."""

    def __init__(self, matcher: Any):
        self._matcher = matcher

    def fill(self, mask: torch.Tensor) -> None:
        """Writes the allowed tokens' bits into `mask`, a contiguous int32 CPU row of the
        vocabulary's words. A matcher in error allows nothing (the sampler then fails the row)."""
        if mask.dtype != torch.int32 or mask.device.type != "cpu" or not mask.is_contiguous():
            raise ValueError("a mask row is a contiguous int32 CPU tensor")
        self._matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def take(self, token: int) -> bool:
        """The row picked `token`; False when the grammar did not allow it (the row then stops)."""
        return bool(self._matcher.consume_token(token))

    @property
    def done(self) -> bool:
        """Nothing but an end-of-sequence id can follow: the text is complete."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self._matcher.get_error())


def _bounded_json(value: Any, what: str) -> str:
    if not isinstance(value, dict):
        raise GrammarError(f"{what} must be a JSON object, not {type(value).__name__}")
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise GrammarError(f"{what} is not JSON: {_one_line(exc)}") from None
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise GrammarError(
            f"{what} is {len(text.encode()):,} bytes, above the {MAX_GRAMMAR_BYTES:,} taken; send a "
            "smaller one"
        )
    return text


def _one_line(problem: object) -> str:
    """llguidance's reason: the first line of its message (the lines after it list the grammar's
    state, which says nothing to a client)."""
    lines = [line.strip() for line in str(problem).splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"
