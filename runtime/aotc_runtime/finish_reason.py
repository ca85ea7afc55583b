"""Why a sequence ended: the decode engine decides it (decode_engine.Made.finish) and every front
end passes it on as it is: `Package.stream(..., text=True)`'s steps, `aotc chat`, and
`finish_reason` in `aotc serve`'s answers, where the values are OpenAI's.

- STOP: an end-of-sequence id (GenerationRequest.finish_reason), a stop string in the text
  (text_delta.py), or a grammar complete (token_grammar.py).
- LENGTH: the sequence's `max_new_tokens`-th token.
- ERROR: the package's logits for the sequence were not finite: it ends at once, alone, and its
  token (0) is no pick; no answer carries it (`stream` raises NonFiniteLogitsError, `aotc serve`
  answers that request with a 500).

OpenAI's chat also says "tool_calls": that is a STOP whose answer holds tool calls, which only the
chat endpoint reads (runtime/aotc_runtime/serve/chat.py, `chat_finish_reason`); the engine knows no
tools.

A member is its value as a string: `==` "stop", `str()` and `format()` give "stop" (Python 3.12
made format() of a mixed-in enum follow str()), and json.dumps writes "stop", as OpenAI's clients
parse it. Torch-free.
"""

from __future__ import annotations

import enum


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value
