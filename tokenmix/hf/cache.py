"""``TokenmixCache``: transformers' ``Cache`` over tokenmix streaming states.

tokenmix models carry one ``ModelState`` per stream: one entry per block, that block's own state
(Toeplitz histories, EMA and TCN buffers, key/value caches, XL memories), not per-layer key/value
tensors. A left-padded batch is read without its padding: rows whose prompts have the same
length share one state (a group) and read their real tokens only, so padding never enters a
state and each row generates what its prompt would alone, whatever the mixer (FNetAR's phases,
chunk boundaries and XL segments follow absolute positions). ``generate()`` hands the cache back
at every step; beam search keeps rows with ``reorder_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache


def padding_mask(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """tokenmix's mask of the last ``length`` positions (generate passes the mask of the whole
    sequence so far); None when every token is real."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -length:].bool()
    return None if bool(mask.all()) else mask


def left_padding(attention_mask: torch.Tensor | None) -> list[int] | None:
    """Real tokens per row of a left-padded ``attention_mask`` (zeros, then ones); None when no row
    is padded on the left (no mask, or padding on the right only, which a causal model never sees)."""
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    if bool(mask[:, 0].all()):
        return None
    lengths = mask.sum(dim=1)
    width = mask.shape[1]
    expected = torch.arange(width, device=mask.device)[None, :] >= (width - lengths)[:, None]
    if not torch.equal(mask, expected):
        raise ValueError("attention_mask: pad on the left (zeros, then ones) or on the right; padding between real tokens is not read")
    return lengths.tolist()


def groups_of(lengths: list[int]) -> dict[int, list[int]]:
    """Rows by their number of real tokens."""
    groups: dict[int, list[int]] = {}
    for row, length in enumerate(lengths):
        groups.setdefault(length, []).append(row)
    return groups


def read_unpadded(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits of a forward without a state, a left-padded batch read row group by row group without
    its padding (logits at padded positions are 0)."""
    lengths = left_padding(attention_mask)
    if lengths is None:
        return model(input_ids, padding_mask(attention_mask, input_ids.shape[1]))
    logits = None
    for length, rows in groups_of(lengths).items():
        if length == 0:
            continue
        out = model(input_ids[rows, input_ids.shape[1] - length :])
        logits = out.new_zeros(*input_ids.shape, out.shape[-1]) if logits is None else logits
        logits[rows, input_ids.shape[1] - length :] = out
    return logits


@dataclass
class _Group:
    rows: torch.Tensor  # batch rows, in the order of the state's rows
    state: object  # their ModelState


class TokenmixCache(Cache):
    """The streaming states of a batch; ``max_length`` is the horizon ``init_state`` plans for."""

    def __init__(self, max_length: int | None = None):
        super().__init__(layers=[])
        self.groups: list[_Group] = []
        self.rows, self.seen = 0, 0
        self.max_length = max_length

    def read(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Logits of the new tokens ``input_ids`` (batch, new), the states advanced over them. The
        first call starts the states (``attention_mask`` may pad on the left); later ones read real tokens."""
        new = input_ids.shape[1]
        window = None if attention_mask is None else attention_mask[:, -new:]
        if not self.groups:
            groups = groups_of(left_padding(window) or [new] * input_ids.shape[0])
            self.rows = input_ids.shape[0]
            for rows in groups.values():
                state = model.init_state(len(rows), max_length=self.max_length, device=input_ids.device)
                self.groups.append(_Group(torch.tensor(rows), state))
            starts = [new - length for length in groups]  # each group reads its real tokens only
        else:
            if window is not None and not bool(window.all()):
                raise ValueError("attention_mask: after the prompt every new token must be real (1)")
            starts = [0] * len(self.groups)
        logits = None
        for group, start in zip(self.groups, starts, strict=True):
            if start == new:  # an empty prompt: nothing to read yet
                continue
            out, group.state = model(input_ids[group.rows, start:], state=group.state, return_state=True)
            logits = out.new_zeros(*input_ids.shape, out.shape[-1]) if logits is None else logits
            logits[group.rows, start:] = out
        self.seen += new
        return logits

    @property
    def layer_states(self) -> list:
        """One entry per block: that block's state (a list of them, one per row group, when a
        left-padded batch has prompts of several lengths)."""
        per_group = [group.state.blocks for group in self.groups]
        if len(per_group) == 1:
            return list(per_group[0])
        return [list(states) for states in zip(*per_group, strict=True)]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens read so far, padding included: the length of the sequence ``generate()`` holds."""
        return self.seen

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no fixed size

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at ``indices``, in that order (repeats allowed)."""
        indices = torch.as_tensor(indices).tolist()
        where = {
            int(row): (number, position) for number, group in enumerate(self.groups) for position, row in enumerate(group.rows.tolist())
        }
        kept: list[_Group] = []
        for number, group in enumerate(self.groups):
            taken = [(new_row, where[old][1]) for new_row, old in enumerate(indices) if where[old][0] == number]
            if taken:
                rows, positions = zip(*taken, strict=True)
                kept.append(_Group(torch.tensor(rows), group.state.select(list(positions))))
        self.groups, self.rows = kept, len(indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self.rows).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a tokenmix streaming state cannot be cropped (no assisted or speculative decoding)")

    def reset(self) -> None:
        self.groups, self.rows, self.seen = [], 0, 0

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return self.rows
