"""Each migration of ``tokenmix.runs.migrations`` on a saved file of the format it upgrades.

The files: ``tests/fixtures/format1_*.pt`` (checkpoints of tokenmix 0.2 and earlier, format 1; their model
configs are of formats 2 and 3), ``tests/fixtures/saved_models`` (configs of format 3) and
``tests/fixtures/old_formats`` (written in the older layouts by ``tests/old_formats.py``).
"""

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from locations import FIXTURES
from old_formats import FOLDER as OLD
from old_formats import FORMAT1_OPTIONS, SEGMENT
from safetensors.torch import load_file
from saved_models import FOLDER as SAVED_MODELS
from saved_models import TOKENS

from tokenmix.models.config import FORMAT_VERSION, config_format
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import FORMAT_KEY, check_checkpoint, load_checkpoint
from tokenmix.runs.legacy import convert_checkpoint, read_trusted
from tokenmix.runs.migrations import (
    CONFIG_MIGRATIONS,
    checkpoint_format_1_to_2,
    config_format_1_to_2,
    config_format_2_to_3,
    config_format_3_to_4,
    config_format_4_to_5,
    read_model_config,
    signature_with_segment_length,
)

DATA = FIXTURES
XL_CHECKPOINT, SEGMENT_STATE_CHECKPOINT = DATA / "format1_transformer_xl.pt", DATA / "format1_segment_state.pt"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _same_logits(folder: Path, **warns) -> None:
    """The model folder opens (with a format 1 warning where ``warns``) and gives the logits saved beside it."""
    if warns:
        with pytest.warns(UserWarning, match="predates"):
            model = open_run(folder).model
    else:
        model = open_run(folder).model
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), load_file(str(folder / "logits.safetensors"))["logits"], rtol=1e-5, atol=1e-6)


def test_each_older_config_format_has_its_migration():
    assert sorted(CONFIG_MIGRATIONS) == list(range(1, FORMAT_VERSION))


def test_config_format_1_to_2_fills_in_todays_defaults_with_a_warning():
    folder = OLD / "config_format1"
    saved = _config(folder)
    assert config_format(saved) == 1
    with pytest.warns(UserWarning, match="predates tokenmix 0.2"):
        upgraded = config_format_1_to_2(saved)
    assert config_format(upgraded) == 2 and upgraded["options"] == FORMAT1_OPTIONS
    _same_logits(folder, warns=True)
    with pytest.warns(UserWarning, match="predates"):
        mixer = open_run(folder).config.options["mixer"]
    assert mixer["rpe_dim"] == 4 and mixer["decay"] == 0.9 and "rpe_layers" in mixer  # passed, and filled in


def test_config_format_2_to_3_gives_the_one_head_there_was():
    saved = read_trusted(SEGMENT_STATE_CHECKPOINT)["model_config"]  # a checkpoint of tokenmix 0.1's successor: format 2
    assert config_format(saved) == 2 and "pool" not in saved
    upgraded = config_format_2_to_3(saved)
    assert config_format(upgraded) == 3 and (upgraded["pool"], upgraded["documents"]) == ("mean", 1)
    config = read_model_config(saved)
    assert (config.pool, config.documents) == ("mean", 1)


def test_config_format_3_to_4_makes_xl_attention_the_registered_mixer():
    folder = SAVED_MODELS / "transformer_xl"
    saved = _config(folder)
    assert config_format(saved) == 3 and saved["options"]["mixer"] == "attention" and "window" in saved["options"]
    upgraded = config_format_3_to_4(saved)
    assert config_format(upgraded) == 4 and upgraded["options"]["mixer"] == "relative_attention" and "window" not in upgraded["options"]
    assert config_format_3_to_4(_config(SAVED_MODELS / "tnn"))["options"] == _config(SAVED_MODELS / "tnn")["options"]  # others unchanged
    assert read_trusted(XL_CHECKPOINT)["model_config"]["options"]["mixer"] == "attention"  # a format 1 checkpoint's, too
    _same_logits(folder)


def test_config_format_4_to_5_spells_the_tcns_depth_depth():
    folder = OLD / "config_format4"
    saved = _config(folder)
    assert config_format(saved) == 4
    upgraded = config_format_4_to_5(saved)
    assert config_format(upgraded) == 5 and "tcn_depth" not in upgraded["options"]
    assert upgraded["options"]["depth"] == saved["options"]["tcn_depth"]
    assert open_run(folder).config.options["sequence_mixer"]["depth"] == saved["options"]["tcn_depth"]
    _same_logits(folder)


@pytest.mark.parametrize("path", [XL_CHECKPOINT, SEGMENT_STATE_CHECKPOINT], ids=["ModelState", "SegmentState"])
def test_checkpoint_format_1_to_2_keeps_tensors_and_plain_containers_only(path):
    legacy = read_trusted(path)  # trusted here: the project's own fixtures
    upgraded = checkpoint_format_1_to_2(legacy)
    check_checkpoint({**upgraded, FORMAT_KEY: 2}, path)
    buffer = io.BytesIO()
    torch.save(upgraded, buffer)
    plain = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)  # fails on any pickled object
    assert plain["rng"]["numpy"]["keys"].tolist() == legacy["rng"]["numpy"][1].tolist()
    assert plain["segment_states"][0]["__state__"] == "ModelState"
    assert plain["tokenizer"] is not None  # kept, or bytes for a corpus trained before tokenizers


def test_an_xl_checkpoint_from_before_segment_length_gets_its_runs_length(tmp_path):
    """Its config, and the signature of the stream saved with it, take the run's --seq-len as the segment."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(XL_CHECKPOINT, run / "checkpoint.pt")
    convert_checkpoint(run)
    opened = open_run(run)
    assert "segment_length" not in load_checkpoint(run)["model_config"]["options"]
    assert opened.config.options["segment_length"] == opened.settings["seq_len"] == 32
    signature = load_checkpoint(run)["segment_states"][0]["model"]
    assert "segment_length" not in json.loads(signature)["options"]
    assert signature_with_segment_length(signature, opened.config) == opened.config.to_json()


def test_an_export_from_before_segment_length_gets_the_field_kept_beside_its_config():
    folder = OLD / "export_segment_length"
    assert "segment_length" not in _config(folder)["tokenmix"]["options"] and _config(folder)["segment_length"] == SEGMENT
    run = open_run(folder)
    assert run.kind == "transformers export" and run.config.options["segment_length"] == SEGMENT
