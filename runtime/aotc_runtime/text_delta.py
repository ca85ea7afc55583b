"""A sequence's text as its tokens come, and the stop strings that end it: the decode engine asks
this for every token of a row whose request carries a tokenizer's text (decode_engine.py), so a
stop string ends a sequence in the same place as its end-of-sequence id and its length.

The text sent is the whole row decoded each time (a token may complete a character or change how
the one before it reads), minus what was sent before. With stop strings, the tail that could still
become one is held back until it cannot, and a stop string found is left out, as OpenAI leaves it.
"""

from __future__ import annotations

from typing import Any


def cut_at_stop(text: str, stop: tuple) -> tuple[str, bool]:
    """`text` up to the first stop string in it (which is left out), and whether one was found."""
    found = [text.find(s) for s in stop if s in text]
    return (text[: min(found)], True) if found else (text, False)


class TextDelta:
    def __init__(self, tokenizer: Any, stop: tuple):  # a tokenizers.Tokenizer
        self._tokenizer, self._stop = tokenizer, stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._ids: list = []
        self._sent = 0

    def add(self, token: int, last: bool) -> tuple[str, bool]:
        """(the text to send now, whether a stop string ended the sequence); `last`: the sequence
        ends with this token whatever its text (all that is held back is sent)."""
        self._ids.append(token)
        text = self._tokenizer.decode(self._ids)
        cut, stopped = cut_at_stop(text, self._stop)
        if stopped or last:
            end = len(cut)
        else:  # an unfinished character decodes to U+FFFD until its last byte comes
            end = len(text.rstrip("\ufffd")) - self._hold
        if end <= self._sent:
            return "", stopped
        delta, self._sent = cut[self._sent : end], end
        return delta, stopped
