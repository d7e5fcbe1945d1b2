"""What ``tokenmix serve`` serves: a causal language model and its tokenizer, from a run, a checkpoint or an export."""

from __future__ import annotations

from pathlib import Path


def load_served(path: str, device: str):
    """(model, tokenizer, default id) of a run directory, checkpoint file or ``export-hf`` folder."""
    from ..data.tokenizer import Tokenizer
    from ..models.pretrained import from_pretrained
    from ..train.checkpoint import CHECKPOINT_FILE, model_from_checkpoint

    location = Path(path).expanduser()
    if not location.exists():
        raise ValueError(f"{path!r} does not exist (give a run directory, checkpoint.pt or export-hf folder)")
    if location.is_dir() and not (location / CHECKPOINT_FILE).is_file():
        model, tokenizer = from_pretrained(location, device=device), Tokenizer.load(location)
    else:
        model, train_config, tokenizer = model_from_checkpoint(location, device)
        if tokenizer is None:
            raise ValueError(f"serve answers with text; {path!r} was trained on {train_config['data']!r}, which is not text")
    if model.config.task != "lm":
        raise ValueError(f"serve needs a causal LM (task 'lm'); {path!r} is task {model.config.task!r}")
    name = (location if location.is_dir() else location.parent).resolve().name
    return model.eval(), tokenizer, name
