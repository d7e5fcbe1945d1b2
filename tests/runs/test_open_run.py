"""``tokenmix.open_run``: one loader for every place a trained model lies on disk, giving the same model from each."""

import shutil

import pytest
import torch

import tokenmix
from tokenmix.data.tokenizer import byte_tokenizer


def _logits(run) -> torch.Tensor:
    with torch.no_grad():
        return run.model(torch.arange(12).view(1, 12))


def test_a_run_directory_its_checkpoint_its_model_folder_and_its_export_give_one_model(tiny_runs):
    run = tiny_runs["lm"]
    places = {"run": run, "checkpoint": run / "checkpoint.pt", "model": run / "model"}
    if "export" in tiny_runs:
        places["export"] = tiny_runs["export"]
    opened = {name: tokenmix.open_run(path) for name, path in places.items()}
    expected = _logits(opened["run"])
    for name, each in opened.items():
        assert not each.model.training and each.tokenizer.name == "bytes", name  # an export's keeps the mask as a token
        torch.testing.assert_close(_logits(each), expected, rtol=0, atol=0, msg=name)
    kinds = {"run": "checkpoint", "checkpoint": "checkpoint", "model": "model folder", "export": "transformers export"}
    assert {name: each.kind for name, each in opened.items()} == {name: kinds[name] for name in opened}
    assert opened["run"].settings["seq_len"] > 0 and opened["run"].step == 1 and opened["run"].directory == run
    assert opened["checkpoint"].directory == run and opened["run"].name == run.name
    assert opened["model"].settings is None and opened["model"].step is None


def test_what_a_command_needs_and_a_folder_lacks_is_named(tiny_runs, tmp_path):
    folder = tokenmix.open_run(tiny_runs["lm"] / "model")
    with pytest.raises(ValueError, match="eval reads the settings a run was trained with.*is a model folder"):
        folder.training_settings("eval")
    shutil.copytree(tiny_runs["lm"] / "model", tmp_path / "model")
    (tmp_path / "model" / "tokenizer.json").unlink()
    assert tokenmix.open_run(tmp_path / "model").tokenizer == byte_tokenizer()  # a byte-level model reads bytes
    with pytest.raises(ValueError, match="does not exist"):
        tokenmix.open_run(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="checkpoint.pt' does not exist"):
        tokenmix.open_run(tmp_path)  # a folder with neither a checkpoint nor a model's files
