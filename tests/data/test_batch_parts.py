"""With context parallelism each process of a group reads its part of every training window alone
(``Objective.batch(part=...)``): the parts of the group put together are the batch one process reads whole,
and no process reads ids outside its part of each window."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from tokenmix.data import load_data, step_generator
from tokenmix.data.batches import StreamBatches
from tokenmix.data.prepare import PrepareOptions, prepare
from tokenmix.data.tokenizer import byte_tokenizer
from tokenmix.parallel import shard_bounds
from tokenmix.train.objectives import objective_for

LENGTH, BATCH = 61, 6  # a length no group size divides


class ReadRecorder:
    """A prepared split that notes how many ids each read takes from it."""

    def __init__(self, split):
        self.split, self.read = split, []

    def numel(self) -> int:
        return self.split.numel()

    def document_at(self, position: int) -> tuple[int, int]:
        return self.split.document_at(position)

    def __getitem__(self, key: slice) -> torch.Tensor:
        ids = self.split[key]
        self.read.append(len(ids))
        return ids


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Documents of 1 to 150 bytes (many shorter than a window: padded within documents), prepared as bytes."""
    root = tmp_path_factory.mktemp("parts")
    rng = random.Random(0)
    texts = root / "texts.txt"
    texts.write_text("\n\n".join("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 150))) for _ in range(400)))
    prepare([str(texts)], byte_tokenizer(), root / "data", PrepareOptions(text_unit="paragraph"))
    return root / "data"


@pytest.mark.parametrize("processes", [2, 3])
@pytest.mark.parametrize("windows", ["across", "within"])
@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_the_parts_of_a_group_put_together_are_the_whole_batch(prepared, task, windows, processes):
    data = load_data(f"{prepared}:windows={windows}", LENGTH)
    objective = objective_for(data, task)
    inputs, targets, mask = objective.batch(BATCH, LENGTH, step_generator(0, 5))
    assert (mask is None) == (windows == "across")  # within documents, some windows are padded
    parts = []
    for start, stop in shard_bounds(LENGTH, processes):
        objective.data = dataclasses.replace(data, train=ReadRecorder(data.train))
        parts.append(objective.batch(BATCH, LENGTH, step_generator(0, 5), part=(start, stop)))
        assert sum(objective.data.train.read) <= BATCH * (stop - start + 1)  # its inputs and their next tokens, no more
        assert parts[-1][0].shape == parts[-1][1].shape == (BATCH, stop - start)
    assert torch.equal(torch.cat([part[0] for part in parts], dim=1), inputs)
    assert torch.equal(torch.cat([part[1] for part in parts], dim=1), targets)
    assert all((part[2] is None and mask is None) or torch.equal(part[2], mask) for part in parts)  # the mask of whole windows


def test_a_segment_recurrent_stream_is_read_by_parts_alike(prepared):
    data = load_data(str(prepared), LENGTH)
    whole = StreamBatches(data.train, 2, LENGTH).batch(3)
    parts = []
    for start, stop in shard_bounds(LENGTH, 3):
        recorder = ReadRecorder(data.train)
        parts.append(StreamBatches(recorder, 2, LENGTH).batch(3, part=(start, stop)))
        assert sum(recorder.read) == 2 * (stop - start + 1)
    assert all(torch.equal(torch.cat([part[index] for part in parts], dim=1), whole[index]) for index in (0, 1))
    assert all(part[2] == whole[2] for part in parts)
