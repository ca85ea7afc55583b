"""Each new token's log-probability, and its most likely alternatives, in OpenAI's two shapes:
completions' legacy `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` and chat's
`{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`.

The numbers are the runtime's (decode_engine.Made.logprob and .top_logprobs: the log-softmax of
the package's logits at that position). A token's text is the tokenizer's decoding of it alone
(special tokens shown, as vLLM writes them); without a tokenizer it is `token_id:N`, vLLM's
spelling of a bare id. `text_offset` counts characters of those texts from the start of the
completion's text, as vLLM counts them.
"""

from __future__ import annotations

from typing import Any


def token_text(tokenizer: Any, token: int) -> str:
    if tokenizer is None:
        return f"token_id:{token}"
    return tokenizer.decode([token], skip_special_tokens=False)


def _entries(events: list) -> list:
    """(token, logprob, [(alternative, logprob), ...]) of each token of the engine's events."""
    found = []
    for event in events:
        for token in event["token_ids"]:
            found.append((token, event.get("logprob"), event.get("top_logprobs") or []))
    return found


def completion_logprobs(events: list, tokenizer: Any, offset: int) -> tuple[dict, int]:
    """(the legacy logprobs of the events' tokens, the text offset after them). As OpenAI's, each
    top_logprobs entry holds the sampled token too, so it may hold one more than asked."""
    shaped: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, logprob, top in _entries(events):
        text = token_text(tokenizer, token)
        alternatives = {token_text(tokenizer, other): value for other, value in top}
        alternatives.setdefault(text, logprob)
        shaped["tokens"].append(text)
        shaped["token_logprobs"].append(logprob)
        shaped["top_logprobs"].append(alternatives)
        shaped["text_offset"].append(offset)
        offset += len(text)
    return shaped, offset


def _chat_token(tokenizer: Any, token: int, logprob: float | None) -> dict:
    text = token_text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(events: list, tokenizer: Any) -> dict:
    """Chat's logprobs of the events' tokens: {"content": [...], "refusal": None}."""
    content = [
        {
            **_chat_token(tokenizer, token, logprob),
            "top_logprobs": [_chat_token(tokenizer, other, value) for other, value in top],
        }
        for token, logprob, top in _entries(events)
    ]
    return {"content": content, "refusal": None}
