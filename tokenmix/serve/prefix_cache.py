"""The prefix cache: a prompt's state and last logits, kept for later requests that start with it.

States are exact, so a request whose prompt begins with a cached one resumes from that state and reads
only the rest. Entries are evicted least recently used first, when the cache holds ``entries`` prompts or
when the memory budget needs their bytes. Not thread-safe: the scheduler calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class CachedPrompt:
    """A prompt's state and last logits, kept for requests that start with it."""

    pads: int
    state: object
    logits: torch.Tensor
    nbytes: int


class PrefixCache:
    """Prompts (tuples of ids) of at least ``min_tokens`` tokens, at most ``entries`` of them (``min_tokens``
    0: nothing is cached)."""

    def __init__(self, min_tokens: int, entries: int):
        self.min_tokens, self.entries = min_tokens, entries
        self.prompts: OrderedDict[tuple, CachedPrompt] = OrderedDict()

    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.prompts.values())

    def longest_start(self, prompt: tuple, fits: Callable[[CachedPrompt], bool]) -> tuple | None:
        """The longest cached prompt that ``prompt`` starts with (or equals) and whose entry ``fits``; it
        becomes the most recently used. None when there is none."""
        found = [key for key in self.prompts if len(key) <= len(prompt) and prompt[: len(key)] == key and fits(self.prompts[key])]
        key = max(found, key=len, default=None)
        if key is not None:
            self.prompts.move_to_end(key)
        return key

    def evict_until(self, room: Callable[[int], bool]) -> None:
        """Drop the least recently used prompts until ``room(cached bytes)`` holds (or nothing is left)."""
        while self.prompts and not room(self.nbytes()):
            self.prompts.popitem(last=False)

    def remember(self, prompt: tuple, pads: int, state, logits: torch.Tensor, over_budget: Callable[[int], bool]) -> None:
        """Keep ``prompt``'s state unless ``over_budget(bytes the cache would then hold)``, evicting older
        prompts first where the entry count or the budget asks for it."""
        entry = CachedPrompt(pads, state, logits, state.nbytes())
        self.prompts.pop(prompt, None)
        while self.prompts and (len(self.prompts) >= self.entries or over_budget(self.nbytes() + entry.nbytes)):
            self.prompts.popitem(last=False)
        if not over_budget(self.nbytes() + entry.nbytes):
            self.prompts[prompt] = entry

    def __getitem__(self, prompt: tuple) -> CachedPrompt:
        return self.prompts[prompt]

    def __bool__(self) -> bool:
        return bool(self.prompts)
