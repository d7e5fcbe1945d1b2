"""What ``tokenmix serve`` serves: a causal language model with its tokenizer (any run ``open_run`` opens)."""

from __future__ import annotations

from ..runs import Run


def check_servable(run: Run, path: str) -> None:
    """ValueError unless ``run`` (opened from ``path``) is a causal LM with a tokenizer: serve answers with text."""
    run.text_tokenizer("serve answers with text")
    if run.config.task != "lm":
        raise ValueError(f"serve needs a causal LM (task 'lm'); {path!r} is task {run.config.task!r}")
