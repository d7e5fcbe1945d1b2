"""Text from an exported directory through transformers alone: ``AutoModelForCausalLM`` and
``AutoTokenizer`` read it, ``generate()`` decodes (``tokenmix generate DIR --transformers``)."""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..generation import check_sampling


def transformers_generate(
    directory, texts: list[str], max_new_tokens: int, *, temperature: float, top_k: int | None, top_p: float | None, seed: int
) -> tuple[list[list[int]], float]:
    """The new token ids of each prompt (greedy at temperature 0, else sampled, seeded) and the
    seconds ``generate()`` took. Sampling uses transformers' own random draws (seeded once through
    torch), so its samples differ from ``tokenmix.generate``'s per-row generators."""
    check_sampling(temperature, top_k, top_p, seed)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # left padding is masked: any id will do
    rows = [tokenizer(text)["input_ids"] for text in texts]
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    torch.manual_seed(seed)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=pad, **sampling
        )
    return [row[width:].tolist() for row in out], time.perf_counter() - started
