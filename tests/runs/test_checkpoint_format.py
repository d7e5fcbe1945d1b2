"""Checkpoints hold tensors and plain containers only (format 2); older ones convert once, on the user's word.

The two files in tests/fixtures were written by earlier tokenmix versions (a Transformer-XL run of
commit a8d19a8, whose segment state is a ``ModelState``, and one of commit 07b3d79~1, whose state is
the older ``SegmentState`` and which predates tokenizers).
"""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import usage_error
from locations import FIXTURES

from tokenmix.cli import main
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.runs.legacy import LEGACY_PICKLE
from tokenmix.state import StreamState

FORMAT1 = FIXTURES


def _legacy_run(tmp_path, name: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FORMAT1 / name, run / "checkpoint.pt")
    return run


def test_a_checkpoint_is_tensors_and_plain_containers(tiny_runs):
    state = torch.load(Path(tiny_runs["lm"]) / "checkpoint.pt", weights_only=True)  # fails on any pickled object

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                assert isinstance(key, (str, int)), where
                walk(item, f"{where}.{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{where}[{index}]")
        else:
            assert value is None or isinstance(value, (torch.Tensor, int, float, str, bool)), f"{where}: {type(value)}"

    walk(state, "checkpoint")
    assert state["checkpoint_format"] == 2


@pytest.mark.parametrize("name", ["format1_transformer_xl.pt", "format1_segment_state.pt"])
def test_a_format1_checkpoint_is_refused_then_converted_on_trust(tmp_path, capsys, name):
    run = _legacy_run(tmp_path, name)
    original = (run / "checkpoint.pt").read_bytes()
    error = usage_error(["eval", str(run), "--max-tokens", "64"], capsys)
    assert "holds pickled Python objects" in error and "tokenmix convert-checkpoint" in error
    assert "--trust" in usage_error(["convert-checkpoint", str(run)], capsys)
    assert (run / "checkpoint.pt").read_bytes() == original  # untouched without --trust
    assert main(["convert-checkpoint", str(run), "--trust"]) == 0
    assert (run / "checkpoint.pt.format1").read_bytes() == original
    # trusted here: these are the project's own fixtures
    legacy = torch.load(run / "checkpoint.pt.format1", weights_only=False, pickle_module=LEGACY_PICKLE)
    converted = load_checkpoint(run)
    assert converted["step"] == legacy["step"] and converted["train_config"] == legacy["train_config"]
    for key, tensor in legacy["model"].items():
        assert torch.equal(converted["model"][key], tensor)
    assert torch.equal(converted["rng"]["torch"], legacy["rng"]["torch"])
    assert converted["rng"]["numpy"]["keys"].tolist() == legacy["rng"]["numpy"][1].tolist()
    (segment,) = converted["segment_states"]
    state = StreamState.from_plain(segment)
    written = legacy["segment_states"][0]  # a ModelState of XL block states, or the older SegmentState of memories
    memories = [block.memory for block in written.blocks] if hasattr(written, "blocks") else written.memory
    assert all(torch.equal(block.memory, memory) for block, memory in zip(state.blocks, memories, strict=True))
    tokenizer = open_run(run).tokenizer
    assert tokenizer is not None and tokenizer.name == "bytes"
    assert main(["eval", str(run), "--max-tokens", "64", "--threads", "1"]) == 0
    error = usage_error(["convert-checkpoint", str(run), "--trust"], capsys)
    assert "already of format 2" in error or "checkpoint.pt.format1" in error


def test_a_converted_xl_run_resumes(tmp_path):
    run = _legacy_run(tmp_path, "format1_transformer_xl.pt")
    assert main(["convert-checkpoint", str(run), "--trust"]) == 0
    before = load_checkpoint(run)
    short = ["--eval-tokens", "64", "--final-eval-tokens", "64", "--sample-tokens", "16"]  # not the whole of shakespeare's validation
    assert main(["train", "--resume", "--out", str(run), "--steps", "4", *short]) == 0
    after = load_checkpoint(run)
    assert after["step"] == 4 and before["step"] == 3
    assert after["segment_states"][0]["__state__"] == "ModelState"
