"""Small files in the layouts of older tokenmix formats, where no release left one in tests/fixtures.

``python tests/old_formats.py`` writes, under ``tests/fixtures/old_formats``, what each migration of
``tokenmix.runs.migrations`` upgrades that tests/fixtures held no file of (format 1 checkpoints, the format 2
and 3 configs inside them and the format 3 configs of ``saved_models`` are releases' own files):

- ``config_format1``: a model folder whose config is format 1 (tokenmix 0.1: no ``format_version``,
  only the options passed by hand, flat), with its weights and the logits it gives for ``TOKENS``;
- ``config_format4``: ``saved_models/tcnca`` as format 4 wrote it (flat options, the TCN's ``tcn_depth``);
- ``export_segment_length``: a transformers export of a Transformer-XL from before XL models recorded
  their ``segment_length`` in their config (kept beside it, as ``segment_length``).

Run it once; never to refresh a file: the tests hold later versions to these.
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from saved_models import FOLDER as SAVED_MODELS
from saved_models import TOKENS

import tokenmix

FOLDER = Path(__file__).parent / "fixtures" / "old_formats"
FORMAT1_OPTIONS = {"rpe_dim": 4, "decay": 0.9}
SEGMENT = 6


def write_config_format1(folder: Path) -> None:
    torch.manual_seed(0)
    model = tokenmix.build_model("tnn", vocab_size=20, dim=8, depth=1, **FORMAT1_OPTIONS).eval()
    model.save_pretrained(folder)
    config = {"name": "tnn", "task": "lm", "vocab_size": 20, "dim": 8, "depth": 1, "num_classes": None, "options": FORMAT1_OPTIONS}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    with torch.no_grad():
        save_file({"logits": model(TOKENS)}, str(folder / "logits.safetensors"))


def write_config_format4(folder: Path) -> None:
    shutil.copytree(SAVED_MODELS / "tcnca", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 4}, indent=2, sort_keys=True))


def write_export_segment_length(folder: Path) -> None:
    import tokenmix.hf

    torch.manual_seed(0)
    model = tokenmix.build_model("transformer_xl", vocab_size=20, dim=8, depth=1, segment_length=SEGMENT, memory_length=4)
    tokenmix.hf.export(model, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["tokenmix"]["options"]["segment_length"]
    (folder / "config.json").write_text(json.dumps({**config, "segment_length": SEGMENT}, indent=2, sort_keys=True))


if __name__ == "__main__":
    for name, write in [
        ("config_format1", write_config_format1),
        ("config_format4", write_config_format4),
        ("export_segment_length", write_export_segment_length),
    ]:
        if not (FOLDER / name).exists():
            write(FOLDER / name)
