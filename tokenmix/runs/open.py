"""``open_run``: a trained model and what its files say about it, from whatever on disk holds one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.corpus import BYTE_VOCAB
from ..data.tokenizer import TOKENIZER_FILE, Tokenizer, byte_tokenizer
from ..devices import resolve_device
from ..models.config import ModelConfig
from ..models.model import SequenceModel
from .checkpoint import check_tokenizer_beside, checked_model_of, checkpoint_tokenizer, load_checkpoint, resolve_checkpoint
from .folder import is_model_folder, read_model_folder, weights_source
from .sharded import shards_of
from .weights import load_weights

CHECKPOINT, SHARDED = "checkpoint", "sharded checkpoint"  # the kinds of a Run besides folder.py's two layouts


@dataclass
class Run:
    """A trained model opened from disk (``open_run``), in eval mode.

    ``path``: what was opened, as given; ``kind``: "checkpoint", "sharded checkpoint" (``--fsdp``), "model
    folder" (``save_pretrained``) or "transformers export". ``settings``: the training settings its
    checkpoint records (``TrainConfig`` as the plain dict the file holds: data, seq_len, seed, ...), None
    for a folder, which records none; ``step``: the checkpoint's step. ``tokenizer``: the one the run was
    trained with; None for data with ids of its own (ListOps, LRA, recall).
    """

    model: SequenceModel
    tokenizer: Tokenizer | None
    path: Path
    kind: str
    settings: dict | None = None
    step: int | None = None

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def directory(self) -> Path:
        """The folder opened, or the one holding the checkpoint file opened (a run directory's files lie there)."""
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def name(self) -> str:
        """The name of ``directory``: what ``tokenmix serve`` calls the model unless told."""
        return self.directory.resolve().name

    def training_settings(self, needed_by: str) -> dict:
        """``settings``; ValueError saying ``needed_by`` (a command) reads them, for a folder without any."""
        if self.settings is None:
            raise ValueError(
                f"{needed_by} reads the settings a run was trained with (its data and length), which a checkpoint records; "
                f"{str(self.path)!r} is a {self.kind}: give its run directory or checkpoint.pt"
            )
        return self.settings

    def text_tokenizer(self, needed_by: str) -> Tokenizer:
        """``tokenizer``; ValueError saying what ``needed_by`` (e.g. "generate writes text") needs, for a run without one."""
        if self.tokenizer is not None:
            return self.tokenizer
        if self.settings is not None:
            raise ValueError(f"{needed_by}; {str(self.path)!r} was trained on {self.settings['data']!r}, which is not text")
        ids = self.config.vocab_size
        raise ValueError(f"{needed_by}; {str(self.path)!r} has no {TOKENIZER_FILE} for its {ids} token ids: put the tokenizer beside it")


def open_run(path, *, device=None, dtype: torch.dtype | None = None) -> Run:
    """The trained model at ``path``, on ``device`` (default CPU) in ``dtype`` (default: as saved), with its
    tokenizer and what else its files record (``Run``). ``path``: a run directory (``tokenmix train --out``), a
    checkpoint file (whole, or naming its shards), a ``save_pretrained`` folder (a run's ``model/``) or a
    transformers export (``tokenmix export-hf``). Older formats are upgraded (``migrations.py``); files that
    would run code (pickled objects) are refused. ValueError naming the file for anything missing or damaged."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating point torch.dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}")
    location = Path(path).expanduser()
    if not location.exists():
        raise ValueError(f"{str(path)!r} does not exist (give a run directory, checkpoint.pt, model folder or export-hf folder)")
    opened = _open_folder(location) if is_model_folder(location) else _open_checkpoint(location)
    model = SequenceModel(opened.config)
    saved = next((tensor.dtype for tensor in opened.weights.values() if tensor.is_floating_point()), None)
    model.to(dtype=saved)  # the saved precision unless ``dtype`` says otherwise
    load_weights(model, opened.weights, opened.source)
    model.to(device=resolve_device(device or "cpu"), dtype=dtype).eval()
    return Run(model, opened.tokenizer, location, opened.kind, opened.settings, opened.step)


@dataclass
class _Opened:
    """What a file gives before a model is built: its config (checked against its weights), the weights, and the rest."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    source: str  # how errors name the weights
    tokenizer: Tokenizer | None
    kind: str
    settings: dict | None = None
    step: int | None = None


def _open_checkpoint(path: Path) -> _Opened:
    """A checkpoint file or run directory. Its tokenizer is the one it keeps; a run directory's ``tokenizer.json``
    must be that one: an edited or damaged copy is refused rather than ignored."""
    file = resolve_checkpoint(path)
    state = load_checkpoint(file)
    config, weights = checked_model_of(state, file)
    tokenizer = checkpoint_tokenizer(state, file)
    check_tokenizer_beside(file, tokenizer)
    kind = CHECKPOINT if shards_of(state, file) is None else SHARDED
    return _Opened(config, weights, f"checkpoint {str(file)!r}", tokenizer, kind, dict(state["train_config"]), state["step"])


def _open_folder(path: Path) -> _Opened:
    """A model folder or export. Its tokenizer is the ``tokenizer.json`` beside its files; without one, bytes
    for a byte-level model (256 ids, or 257 with a mask), else none."""
    config, weights, layout = read_model_folder(path)
    if (path / TOKENIZER_FILE).is_file():
        tokenizer = Tokenizer.load(path)
    else:
        tokenizer = byte_tokenizer() if config.vocab_size in (BYTE_VOCAB, BYTE_VOCAB + 1) else None
    return _Opened(config, weights, weights_source(path), tokenizer, layout)
