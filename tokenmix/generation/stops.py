"""When a generated row is done: a stop token id, a list of them, or a stop string."""

from __future__ import annotations

from collections.abc import Sequence

from ..data.corpus import BYTE_VOCAB
from ..data.tokenizer import Tokenizer, byte_tokenizer

Stop = int | str | Sequence[int] | None


def stop_ids(stop: Stop, vocab_size: int) -> list[int] | None:
    """The token ids that end a row: a token id or a non-empty list of them."""
    if stop is None:
        return None
    ids = [stop] if isinstance(stop, int) and not isinstance(stop, bool) else list(stop)
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"stop must be a token id in [0, {vocab_size}), a non-empty list of them, or a string; got {stop!r}")
    return ids


class StopRule:
    """When a row is done: its ids end with the stop ids, or (a string) the text its ids decode to
    contains the stop text. Token boundaries of a BPE need not fall where the text does, so the row
    ends with the token that completes the string; ``cut`` trims the text after it."""

    def __init__(self, stop: Stop, vocab_size: int, tokenizer: Tokenizer | None = None):
        self.ids, self.text = None, None
        if isinstance(stop, str):
            if tokenizer is None and vocab_size != BYTE_VOCAB:
                raise ValueError(f"stop as a string needs the model's tokenizer (vocabulary {vocab_size}, not bytes): pass tokenizer=")
            if not stop:
                raise ValueError("stop must not be an empty string")
            self.text, self.token_bytes = stop.encode(), (tokenizer or byte_tokenizer()).token_bytes
        else:
            self.ids = stop_ids(stop, vocab_size)

    def reached(self, tokens: list[int]) -> bool:
        if self.ids is not None:
            return len(tokens) >= len(self.ids) and tokens[len(tokens) - len(self.ids) :] == self.ids
        if self.text is None or not tokens:
            return False
        # Not found before the last token: a match ends inside its bytes, so a tail this long holds it.
        needed, tail = len(self.text) - 1 + len(self.token_bytes[tokens[-1]]), []
        for token in reversed(tokens):
            tail.append(self.token_bytes[token])
            needed -= len(tail[-1])
            if needed <= 0:
                break
        return self.text in b"".join(reversed(tail))

    def cut(self, text: bytes) -> bytes:
        """``text`` up to the end of the first stop string in it (all of it for id stops or none found)."""
        found = -1 if self.text is None else text.find(self.text)
        return text if found < 0 else text[: found + len(self.text)]
