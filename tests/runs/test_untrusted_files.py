"""Nothing executes from a file a user is given.

A crafted pickle (one whose loading creates a marker file) stands in for every file a run directory
or a transformers export holds, and is handed to every command and Python loader that reads that
file: each refuses it with a one-line error (exit status 2 on the command line) and the marker is
never created. ``test_the_crafted_pickles_do_run_code_when_unpickled`` shows the payloads work, so
each test fails if a reader unpickles (``torch.load(weights_only=False)``, ``pickle.loads``).
"""

import io
import pickle
import shutil

import numpy as np
import pytest
import torch
from conftest import usage_error

import tokenmix
from tokenmix.data.lra_image import load_lra_image
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.runs.metrics import read_metrics


class RunsCode:
    """Unpickling this object creates ``marker``: what a malicious file would do, harmlessly."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def crafted_files(marker) -> dict[str, bytes]:
    """The payload as a plain pickle and inside a torch zip archive (what ``torch.save`` writes)."""
    archive = io.BytesIO()
    torch.save({"model_config": RunsCode(marker), "checkpoint_format": 2}, archive)
    return {"pickle": pickle.dumps(RunsCode(marker), protocol=2), "torch_zip": archive.getvalue()}


KINDS = ("pickle", "torch_zip")


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "code_ran"


def test_the_crafted_pickles_do_run_code_when_unpickled(marker, tmp_path):
    files = crafted_files(marker)
    pickle.loads(files["pickle"])
    assert marker.exists()
    marker.unlink()
    (tmp_path / "archive.pt").write_bytes(files["torch_zip"])
    torch.load(tmp_path / "archive.pt", weights_only=False)
    assert marker.exists()


FINETUNE_DATA = ["--data", "listops:max_length=40:train=8:val=4:test=4"]
# Each file of a run or an export, and the commands that read it ({run}/{out}: the copied run and a free folder).
RUN_READERS = {
    "checkpoint.pt": [
        ["eval", "{run}"],
        ["generate", "{run}", "--max-new-tokens", "2"],
        ["plot", "{run}", "--out", "{out}"],
        ["export-hf", "{run}", "{out}"],
        ["train", "--resume", "--out", "{run}"],
        ["finetune", "{run}", "--out", "{out}", *FINETUNE_DATA],
    ],
    "tokenizer.json": [["eval", "{run}"], ["generate", "{run}", "--max-new-tokens", "2"], ["train", "--resume", "--out", "{run}"]],
    "model/config.json": [["finetune", "{run}/model", "--out", "{out}", *FINETUNE_DATA]],
    "model/model.safetensors": [["finetune", "{run}/model", "--out", "{out}", *FINETUNE_DATA]],
    "model/tokenizer.json": [["finetune", "{run}/model", "--out", "{out}", *FINETUNE_DATA]],
    "metrics.jsonl": [["train", "--resume", "--out", "{run}", "--steps", "3"]],
}
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
CASES = [(name, command) for name, commands in RUN_READERS.items() for command in commands]


def _copy(source, tmp_path):
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "command"), CASES, ids=[f"{name}-{command[0]}" for name, command in CASES])
def test_commands_refuse_a_crafted_pickle_in_a_run(tiny_runs, tmp_path, marker, capsys, kind, name, command):
    run = _copy(tiny_runs["mlm" if command[0] == "finetune" else "lm"], tmp_path)
    (run / name).write_bytes(crafted_files(marker)[kind])
    arguments = [part.format(run=run, out=tmp_path / "out") for part in command]
    error = usage_error(arguments, capsys)
    assert not marker.exists()
    assert name.split("/")[-1] in error or "checkpoint" in error, error


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", EXPORT_FILES)
def test_generate_transformers_refuses_a_crafted_pickle_in_an_export(tiny_runs, tmp_path, marker, capsys, kind, name):
    pytest.importorskip("transformers")
    export = _copy(tiny_runs["export"], tmp_path)
    (export / name).write_bytes(crafted_files(marker)[kind])
    error = usage_error(["generate", str(export), "--transformers", "--max-new-tokens", "2"], capsys)
    assert not marker.exists() and name in error


def test_an_export_with_a_pickled_weights_file_runs_no_code(tiny_runs, tmp_path, marker):
    """transformers reads ``pytorch_model.bin`` with ``torch.load(weights_only=True)``: an export
    carrying one in place of ``model.safetensors`` is refused by both libraries, and runs nothing."""
    transformers = pytest.importorskip("transformers")
    export = _copy(tiny_runs["export"], tmp_path)
    (export / "model.safetensors").unlink()
    (export / "pytorch_model.bin").write_bytes(crafted_files(marker)["torch_zip"])
    with pytest.raises(ValueError, match="model.safetensors"):
        tokenmix.open_run(export)
    with pytest.raises(Exception):  # noqa: B017 - transformers' own error; what matters is that nothing ran
        transformers.AutoModelForCausalLM.from_pretrained(export)
    assert not marker.exists()


PYTHON_LOADERS = {
    "load_checkpoint": ("checkpoint.pt", lambda run: load_checkpoint(run)),
    "open_run (run)": ("checkpoint.pt", lambda run: open_run(run)),
    "open_run (checkpoint file)": ("checkpoint.pt", lambda run: open_run(run / "checkpoint.pt")),
    "open_run (model weights)": ("model/model.safetensors", lambda run: open_run(run / "model")),
    "open_run (model config)": ("model/config.json", lambda run: open_run(run / "model")),
    "Tokenizer.load": ("tokenizer.json", lambda run: tokenmix.Tokenizer.load(run)),
    "read_metrics": ("metrics.jsonl", lambda run: read_metrics(run / "metrics.jsonl")),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loader", PYTHON_LOADERS)
def test_python_loaders_refuse_a_crafted_pickle(tiny_runs, tmp_path, marker, kind, loader):
    name, load = PYTHON_LOADERS[loader]
    run = _copy(tiny_runs["lm"], tmp_path)
    (run / name).write_bytes(crafted_files(marker)[kind])
    with pytest.raises(ValueError, match=name.split("/")[-1]):
        load(run)
    assert not marker.exists()


def test_an_old_pickled_checkpoint_is_refused_with_the_command_that_converts_it(tiny_runs, tmp_path, marker, capsys):
    run = _copy(tiny_runs["lm"], tmp_path)
    (run / "checkpoint.pt").write_bytes(crafted_files(marker)["torch_zip"])
    error = usage_error(["eval", str(run)], capsys)
    assert "loading would run as code" in error and f"tokenmix convert-checkpoint {run / 'checkpoint.pt'} --trust" in error
    assert "--trust" in usage_error(["convert-checkpoint", str(run)], capsys)  # converting needs the user's word
    assert not marker.exists()


def test_the_cifar_reader_refuses_a_crafted_batch(tmp_path, marker):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    for name in (*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"):
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    assert len(load_lra_image(tmp_path).test) == 2  # the real format reads
    (folder / "data_batch_4").write_bytes(pickle.dumps({b"data": RunsCode(marker), b"labels": [0]}, protocol=2))
    with pytest.raises(ValueError, match=r"data_batch_4 is not a CIFAR-10 python batch \(it names __builtin__.exec, which could run code"):
        load_lra_image(tmp_path)
    assert not marker.exists()


def test_a_crafted_token_cache_entry_is_made_again(tmp_path, marker, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))
    from tokenmix.data.tokenized import cached_encode

    tokenizer = tokenmix.train_bpe(b"to be or not to be " * 50, 270)
    ids, _ = cached_encode(tokenizer, b"to be or not")
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    entry.write_bytes(crafted_files(marker)["pickle"])
    again, note = cached_encode(tokenizer, b"to be or not")
    assert torch.equal(again, ids) and "cached" in note and not marker.exists()
