"""Small saved models of every registered model, written by one release and loaded by later ones.

``python tests/saved_models.py`` writes, for each model of ``list_models()``, a ``save_pretrained``
directory under ``tests/fixtures/saved_models/NAME`` (dim 8, depth 2, vocabulary 20; task lm where the
model has it) and the logits it gives for ``TOKENS`` (``logits.safetensors``).
``test_models.py`` holds every later version to them: the saved config still loads, as the same
model, with the same logits. Run it again only to add a model; never to refresh an existing one.
"""

from pathlib import Path

import torch
from safetensors.torch import save_file

import tokenmix
from tokenmix.models.registry import model_spec

FOLDER = Path(__file__).parent / "fixtures" / "saved_models"
TOKENS = torch.arange(24).remainder(20).view(2, 12)
OPTIONS = {"tnn2d": {"grid": [3, 4]}}  # the 12 tokens of a row as a 3 x 4 grid


def task_of(name: str) -> str:
    return "lm" if "lm" in model_spec(name).tasks else "classify"


def build(name: str) -> torch.nn.Module:
    task = task_of(name)
    extra = {"num_classes": 3} if task == "classify" else {}
    return tokenmix.build_model(name, task=task, vocab_size=20, dim=8, depth=2, **extra, **OPTIONS.get(name, {})).eval()


def write(name: str) -> None:
    torch.manual_seed(0)
    model = build(name)
    model.save_pretrained(FOLDER / name)
    with torch.no_grad():
        save_file({"logits": model(TOKENS)}, str(FOLDER / name / "logits.safetensors"))


if __name__ == "__main__":
    for name in tokenmix.list_models():
        if not (FOLDER / name).exists():
            write(name)
