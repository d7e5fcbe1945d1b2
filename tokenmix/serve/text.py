"""A completion's text as its tokens arrive: UTF-8 decoded incrementally and cut before a stop string.

In the OpenAI completions format the stop string ends the text and is not part of it. A streamed
text must never send what a later token could take back, so the bytes that could still begin a
stop string, and an unfinished UTF-8 character, wait for the next token.
"""

from __future__ import annotations

import codecs


class CompletionText:
    """The text of one choice from its tokens' bytes (``token_bytes[id]``) and its stop strings."""

    def __init__(self, token_bytes: list[bytes], stops: list[str]):
        self.token_bytes, self.stops = token_bytes, [stop.encode() for stop in stops]
        self.raw, self.sent, self.stopped = b"", 0, False
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        """The new text that ``token`` makes final (possibly empty); ``stopped`` once a stop string appears."""
        self.raw += self.token_bytes[token]
        found = [index for index in (self.raw.find(stop) for stop in self.stops) if index >= 0]
        if found:
            self.raw, self.stopped = self.raw[: min(found)], True
            return self._send(len(self.raw), final=True)
        held = max((size for stop in self.stops for size in range(1, len(stop)) if self.raw.endswith(stop[:size])), default=0)
        return self._send(len(self.raw) - held, final=False)

    def finish(self) -> str:
        """What was held back, at the end of the completion."""
        return self._send(len(self.raw), final=True)

    def _send(self, end: int, final: bool) -> str:
        text = self.decoder.decode(self.raw[self.sent : max(end, self.sent)], final)
        self.sent = max(end, self.sent)
        return text


def token_text(data: bytes) -> str:
    """One token's bytes as text for ``logprobs`` (a byte of a split character as \\xNN)."""
    return data.decode("utf-8", "backslashreplace")
