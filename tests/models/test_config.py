"""Saved configs record every resolved option and a version, and reload as the same model."""

import json
import os
import stat
from dataclasses import dataclass

import pytest
import torch

import tokenmix
from tokenmix.blocks.mega import MegaOptions
from tokenmix.fields import Number, setting
from tokenmix.mixers.parts import Configurable
from tokenmix.mixers.ski_tno import SkiTno, SkiTnoOptions
from tokenmix.mixers.tcn import TcnOptions
from tokenmix.models import FORMAT_VERSION, ModelConfig, SequenceModel
from tokenmix.runs.migrations import read_model_config


def test_config_records_every_default_of_every_block_and_mixer():
    config = tokenmix.build_model("ski_tnn", vocab_size=10, dim=8, depth=1, rank=16).config
    mixer = config.options["mixer"]
    assert mixer["rank"] == 16  # given
    assert mixer["name"] == "ski_tno" and mixer["gain"] == 8.0 and mixer["decay"] == 0.99  # mixer defaults
    assert config.options["expand"] == 3 and config.options["glu_activation"] == "silu"  # block defaults
    data = json.loads(config.to_json())
    assert data["format_version"] == FORMAT_VERSION and data["tokenmix_version"] == tokenmix.__version__


def test_a_saved_model_survives_a_default_change(tmp_path, monkeypatch):
    """The ski_tno gain default went from 1 to 8 once; a saved model must not change with it."""
    torch.manual_seed(0)
    model = tokenmix.build_model("ski_tnn", vocab_size=10, dim=8, depth=1).eval()
    model.save_pretrained(tmp_path)
    tokens = torch.randint(0, 10, (2, 30))
    expected = model(tokens)

    @dataclass
    class OldDefaults(SkiTnoOptions):
        gain: float = setting(1.0, Number(0, open_minimum=True), "the old default")

    monkeypatch.setattr(SkiTno, "options_type", OldDefaults)
    assert tokenmix.build_model("ski_tnn", vocab_size=10, dim=8, depth=1).config.options["mixer"]["gain"] == 1.0
    torch.testing.assert_close(tokenmix.open_run(tmp_path).model.eval()(tokens), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format_version=FORMAT_VERSION + 1), "a newer tokenmix wrote it"),
        (lambda d: d.update(surprise=1), "unknown keys"),
        (lambda d: d["options"].update(surprise=1), "unknown option 'surprise'"),
    ],
)
def test_configs_from_a_newer_version_or_with_unknown_keys_are_refused(tmp_path, change, message):
    model = tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1)
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    change(data)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        tokenmix.open_run(tmp_path)


def test_format_1_configs_load_with_a_warning():
    legacy = {"name": "tnn", "task": "lm", "vocab_size": 10, "dim": 8, "depth": 1, "num_classes": None, "options": {"decay": 0.9}}
    with pytest.warns(UserWarning, match="predates"):
        config = read_model_config(legacy)
    assert config.options["mixer"]["decay"] == 0.9 and config.options["mixer"]["rpe_dim"] == 64


def test_open_run_honours_device_and_dtype(tmp_path):
    tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1).save_pretrained(tmp_path)
    loaded = tokenmix.open_run(tmp_path, device="meta", dtype=torch.float64).model
    assert {(p.device.type, p.dtype) for p in loaded.parameters()} == {("meta", torch.float64)}
    with pytest.raises(ValueError, match="not available"):
        tokenmix.open_run(tmp_path, device="cuda:99")
    with pytest.raises(ValueError, match="dtype"):
        tokenmix.open_run(tmp_path, dtype="half")


def test_a_model_reloads_in_the_precision_it_was_saved_in(tmp_path):
    model = tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = tokenmix.open_run(tmp_path).model
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    for name, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name


def test_saved_files_get_the_default_mode(tmp_path):
    tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1).save_pretrained(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    for name in ("config.json", "model.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name


def test_the_tcn_depth_option_is_spelled_depth_wherever_the_tcn_is():
    """A model's depth counts its layers; a TCN's own depth is the ``depth`` of its part, set flat or by its path."""
    assert ModelConfig("tcnca", options={"depth": 3}).options["sequence_mixer"]["depth"] == 3
    assert ModelConfig("tcnca", options={"sequence_mixer.depth": 3}).options["sequence_mixer"]["depth"] == 3
    assert ModelConfig("tcnca_simple", options={"depth": 3}).options["tcn"]["depth"] == 3
    config = ModelConfig("tnn", depth=2, options={"mixer": "tcn", "depth": 3})
    assert config.depth == 2 and config.options["mixer"]["depth"] == 3
    with pytest.raises(ValueError, match="unknown option 'depth' for model 'tnn'"):
        ModelConfig("tnn", options={"depth": 3})
    legacy = ModelConfig("tcnca").to_dict()
    legacy.update(format_version=4, options={"sequence_mixer": "tcn", "tcn_depth": 2})
    assert read_model_config(legacy).options["sequence_mixer"]["depth"] == 2
    with pytest.raises(ValueError, match="predates this tokenmix's"):
        ModelConfig.from_dict(legacy)  # today's format only: older ones go through read_model_config


def test_options_given_flat_by_path_or_nested_resolve_alike():
    """A flat name reaches every part that declares it (``dropout``); a dotted path or a nested dict one part only."""
    flat = ModelConfig("transformer_xl", options={"dropout": 0.1, "heads": 2})
    assert flat.options["dropout"] == flat.options["mixer"]["dropout"] == 0.1 and flat.options["mixer"]["heads"] == 2
    dotted = ModelConfig("transformer_xl", options={"dropout": 0.1, "mixer.dropout": 0.0})
    assert dotted.options["dropout"] == 0.1 and dotted.options["mixer"]["dropout"] == 0.0
    assert ModelConfig("transformer_xl", options=dotted.options).options == dotted.options
    with pytest.raises(ValueError, match="unknown option 'window' for mixer.*relative_attention"):
        ModelConfig("transformer_xl", options={"mixer.window": 8})
    with pytest.raises(ValueError, match="sequence_mixer must be one of"):
        ModelConfig("mega", options={"sequence_mixer": "tno2d"})


def test_a_config_holds_its_options_as_one_typed_tree_resolved_once(monkeypatch):
    """Resolved on construction (from flat, dotted or nested names) into the blocks' options dataclass, each
    mixer's in its ``parts``; building the model resolves nothing again, and the saved form is the nested dict."""
    config = ModelConfig("tcnca", vocab_size=10, dim=8, depth=2, options={"sequence_mixer.depth": 2, "dropout": 0.1})
    assert isinstance(config.options, MegaOptions) and config.options.dropout == 0.1
    tcn = config.options.parts["sequence_mixer"]
    assert tcn.name == "tcn" and isinstance(tcn.options, TcnOptions) and tcn.options.depth == 2
    assert ModelConfig("tcnca", vocab_size=10, dim=8, depth=2, options=config.to_dict()["options"]) == config
    assert config.to_dict()["options"]["sequence_mixer"] == {"name": "tcn", **tcn.options.as_dict()}
    resolved = []
    original = Configurable.resolve_options.__func__
    monkeypatch.setattr(Configurable, "resolve_options", classmethod(lambda cls, *args: resolved.append(cls) or original(cls, *args)))
    model = SequenceModel(config)
    assert resolved == [] and model.blocks[1].sequence.options is tcn.options
    with pytest.raises(ValueError, match="segment_length must be an integer >= 1"):
        ModelConfig("transformer_xl").options["segment_length"] = 0


def test_derived_defaults_are_recorded_as_numbers(tmp_path, monkeypatch):
    """heads=None means "the most heads up to 4 that fit the width": the saved config holds the number."""
    model = tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1, mixer="attention").eval()
    assert model.config.options["mixer"]["heads"] == 4 and model.config.options["mixer"]["max_distance"] == 1024
    model.save_pretrained(tmp_path)
    monkeypatch.setattr("tokenmix.mixers.attention.default_heads", lambda dim, position: 1)
    assert tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1, mixer="attention").config.options["mixer"]["heads"] == 1
    loaded = tokenmix.open_run(tmp_path).model.eval()
    assert loaded.blocks[0].token_mixing.mixer.heads == 4
    tokens = torch.randint(0, 10, (1, 9))
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
