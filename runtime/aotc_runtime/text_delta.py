"""A sequence's text as its tokens come, and the stop strings that end it: the decode engine asks
this for every token of a row whose request carries a tokenizer's text (decode_engine.py), so a
stop string ends a sequence in the same place as its end-of-sequence id and its length.

The text is decoded incrementally, so a row's text costs time linear in its length: each token
decodes only a short window of the row's last ids, not the whole row (the idea of vLLM's
detokenizer, `detokenize_incrementally`, with its prefix and read offsets). A token may complete a
character (an unfinished one decodes to U+FFFD until its last byte comes) or change how the one
before it reads, so the text of the ids not read yet is the window decoded minus the window's
first ids decoded alone: a decoder may read a window's first token unlike the same token mid-row
(SentencePiece's "▁" loses its space at the start), and both decodings start alike.

With stop strings, the tail that could still become one is held back until it cannot, and a stop
string found is left out, as OpenAI leaves it. Only the new text and that tail are searched: a stop
string in the text sent before would have ended the sequence then.
"""

from __future__ import annotations

from typing import Any

UNFINISHED = "\ufffd"  # what a decoder gives for bytes that are not (yet) a whole character
MAX_UNREAD_IDS = 16  # a character is at most 4 bytes: 4 byte tokens, and skipped ones between


def cut_at_stop(text: str, stop: tuple) -> tuple[str, bool]:
    """`text` up to the first stop string in it (which is left out), and whether one was found."""
    found = [text.find(s) for s in stop if s in text]
    return (text[: min(found)], True) if found else (text, False)


class IncrementalText:
    """A row's text, token by token, each token decoding only the window of ids from the prefix
    offset: the ids before the read offset were read (they give the window's first tokens their
    context), those from it not yet. The window moves on when its text ends in a whole character;
    it grows only while tokens add no text or end in an unfinished character."""

    def __init__(self, tokenizer: Any):  # a tokenizers.Tokenizer
        self._tokenizer = tokenizer
        self._window: list = []  # the row's ids from the prefix offset
        self._read = 0  # the read offset, in the window
        self._read_text = ""  # the window's ids before the read offset, decoded alone
        self._given = 0  # characters of the text after the read offset given out already

    def add(self, token: int) -> tuple[str, str]:
        """(the whole characters this token adds, the unfinished tail: a U+FFFD for each character
        at the end that is unfinished or not one)."""
        self._window.append(token)
        unread = self._tokenizer.decode(self._window)[len(self._read_text) :]
        whole = unread.rstrip(UNFINISHED)
        forced = len(self._window) - self._read > MAX_UNREAD_IDS
        if forced:
            # no character takes this many tokens: what is unfinished stays so (a model that
            # makes invalid bytes or skipped tokens without end would grow the window, and each
            # token's decoding with it)
            whole = unread
        new, self._given = whole[self._given :], len(whole)
        # Move on only past text that is whole characters (the next window starts at a character)
        # and past a token that added text: a window whose first ids have none (a special token,
        # skipped) would have the decoder drop the "▁" of the next token instead, unlike mid-row.
        # (Byte fallback's <0xXX> runs are decoded whole: a byte that makes no character turns
        # characters of its run read already into U+FFFD, which keep their first reading here.)
        if (unread or forced) and whole == unread:
            del self._window[: self._read]
            self._read, self._given = len(self._window), 0
            self._read_text = self._tokenizer.decode(self._window)
        return new, unread[len(whole) :]


class TextDelta:
    def __init__(self, tokenizer: Any, stop: tuple):  # a tokenizers.Tokenizer
        self._text, self._stop = IncrementalText(tokenizer), stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._held = ""  # whole characters not sent: the tail that could still begin a stop string
        self._stopped = False

    def add(self, token: int, last: bool) -> tuple[str, bool]:
        """(the text to send now, whether a stop string ended the sequence); `last`: the sequence
        ends with this token whatever its text (all that is held back is sent)."""
        if self._stopped:
            return "", True
        new, unfinished = self._text.add(token)
        held = self._held + new
        cut, stopped = cut_at_stop(held + unfinished, self._stop)
        if stopped or last:
            self._held, self._stopped = "", stopped
            return cut, stopped
        end = max(len(held) - self._hold, 0)
        delta, self._held = held[:end], held[end:]
        return delta, False
