"""A conversation with a text-generation package that carries a chat template: the history of
turns, rendered whole for each reply (chat_template.py), the reply streamed as text
(`Package.stream(text=True)`), and the oldest turns dropped when the history no longer fits the
package's KV cache. Each reply's prompt starts with the last one and its reply, so it is fed only
what is new (prefix_cache.py). `aotc chat` is this in a terminal; Python users can drive it the
same way.

    session = ChatSession(package, system="Be brief.", max_new_tokens=128)
    for text in session.reply("Hello"):
        print(text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .chat_template import ChatTemplate
from .errors import GenerationInputError
from .finish_reason import FinishReason
from .prefix_cache import PrefixCache


class ChatSession:
    def __init__(
        self,
        package: Any,  # a loaded text-generation Package with a tokenizer and a chat template
        template: ChatTemplate,
        *,
        system: str | None = None,
        max_new_tokens: int = 256,
        **sampling: Any,  # Package.stream's temperature, top_k, top_p, seed, ...
    ):
        self.package, self.template = package, template
        self.tokenizer = package.tokenizer
        self.system, self.max_new_tokens, self.sampling = system, max_new_tokens, sampling
        self.turns: list[tuple[str, str]] = []  # (the user's message, the reply)
        self.dropped = 0  # turns the last reply() dropped to fit the cache
        self.cut = False  # the last reply ended at max_new_tokens (FinishReason.LENGTH)
        self.prompt_tokens = 0  # the last reply's prompt, in tokens (the conversation so far)
        self.made = 0  # the last reply's new tokens
        # each turn's prompt starts with the one before and its reply: fed only what is new
        self.prefix_cache = PrefixCache()

    def reset(self) -> None:
        """Forget the turns (the system message stays)."""
        self.turns = []

    def messages(self, user: str, turns: list[tuple[str, str]]) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        past = [
            message
            for asked, answered in turns
            for message in (
                {"role": "user", "content": asked},
                {"role": "assistant", "content": answered},
            )
        ]
        return system + past + [{"role": "user", "content": user}]

    def prompt_ids(self, user: str) -> list[int]:
        """The prompt of the history and `user`'s message; the oldest turns dropped (counted in
        `dropped`) while it and the new tokens do not fit the cache."""
        room = self.package.generation.max_seq_len - self.max_new_tokens
        turns, self.dropped = list(self.turns), 0
        while True:
            ids = self.template.prompt_ids(self.tokenizer, self.messages(user, turns))
            if len(ids) <= room or not turns:
                break
            turns, self.dropped = turns[1:], self.dropped + 1
        if len(ids) > room:
            raise GenerationInputError(
                f"this message makes a prompt of {len(ids)} tokens, and with {self.max_new_tokens} "
                f"new tokens it needs {len(ids) + self.max_new_tokens} positions, but the package's "
                f"KV cache holds {self.package.generation.max_seq_len}; write a shorter message, "
                "ask for fewer new tokens (--max-new-tokens), or export with a larger --max-seq-len"
            )
        self.turns = turns
        self.prompt_tokens = len(ids)
        return ids

    def reply(self, user: str) -> Iterator[str]:
        """The reply's text as it comes; the turn joins the history once the reply is whole (a
        reply closed early is not kept). The prompt is made here, before the first piece: a
        message that cannot fit raises at once, and `dropped` is known."""
        return self._streamed(user, self.prompt_ids(user))

    def _streamed(self, user: str, ids: list[int]) -> Iterator[str]:
        answer = []
        steps = self.package.stream(
            [ids],
            max_new_tokens=self.max_new_tokens,
            text=True,
            prefix_cache=self.prefix_cache,
            **self.sampling,
        )
        made, finish = 0, None
        self.cut = False
        try:
            for step in steps:
                made += 1
                finish = step.finish[0]  # the engine's: None until the reply's last token
                if step.text[0]:
                    answer.append(step.text[0])
                    yield step.text[0]
        finally:
            steps.close()
        self.cut = finish is FinishReason.LENGTH
        self.made = made
        self.turns.append((user, "".join(answer)))
