"""The next token of every sampling row, each with its own settings and generator, and its log-probabilities."""

from __future__ import annotations

import torch

from ..generation import choose_tokens
from .text import token_text


class Sampler:
    """Draws rows of the same settings together (``choose_tokens``), each row with its own generator
    (``row_generator(seed, choice)``), so that a request's tokens are those ``tokenmix.generate`` gives it
    alone with that seed; ``token_bytes`` names the tokens of ``logprobs``."""

    def __init__(self, token_bytes: list[bytes]):
        self.token_bytes = token_bytes

    def sample(self, logits: torch.Tensor, rows: list) -> tuple[list[int], list[dict | None]]:
        """Each row's next token from its line of ``logits`` (rows, vocab), and its ``logprobs`` (None where
        the row's request asks none)."""
        picks = self.choose(logits, rows)
        wanted = [index for index, row in enumerate(rows) if row.job.sampling.logprobs is not None]
        found = self.logprobs(logits[wanted], [picks[index] for index in wanted], [rows[index] for index in wanted])
        logprobs: list[dict | None] = [None] * len(rows)
        for index, entry in zip(wanted, found, strict=True):
            logprobs[index] = entry
        return picks, logprobs

    def choose(self, logits: torch.Tensor, rows: list) -> list[int]:
        """Each row's next token, rows of the same settings drawn together (``choose_tokens``)."""
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            sampling = row.job.sampling
            groups.setdefault((sampling.temperature, sampling.top_k, sampling.top_p), []).append(index)
        picks = [0] * len(rows)
        for (temperature, top_k, top_p), members in groups.items():
            chosen = choose_tokens(logits[members], temperature, top_k, top_p, [rows[index].generator for index in members])
            for index, token in zip(members, chosen.tolist(), strict=True):
                picks[index] = token
        return picks

    def logprobs(self, logits: torch.Tensor, picks: list[int], rows: list) -> list[dict]:
        """The model's log-probability of each chosen token and of its ``logprobs`` most likely ones."""
        if not rows:
            return []
        logprobs = logits.float().log_softmax(dim=-1).cpu()
        found = []
        for line, pick, row in zip(logprobs, picks, rows, strict=True):
            values, ids = line.topk(min(row.job.sampling.logprobs, line.numel()))
            top = {token_text(self.token_bytes[i]): value for value, i in zip(values.tolist(), ids.tolist(), strict=True)}
            found.append({"token": token_text(self.token_bytes[pick]), "logprob": float(line[pick]), "top": top})
        return found
