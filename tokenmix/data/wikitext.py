"""WikiText-103 and WikiText-2 (Merity et al., "Pointer Sentinel Mixture Models", arXiv 1609.07843)
from their release files, as a byte corpus.

``wikitext:DIR`` reads ``wiki.train.tokens``, ``wiki.valid.tokens`` and ``wiki.test.tokens`` (the
tokenized release: rare words replaced by ``<unk>``); ``wikitext:DIR:variant=raw`` reads the
untokenized ``wiki.{train,valid,test}.raw``. DIR holds the three files, or is a folder holding
``wikitext-103/``, ``wikitext-2/`` (or their ``-raw`` twins) with them. Each split is the file's
bytes, articles (`` = Title = `` lines) in their order, so the LM reads documents as they run.
"""

from __future__ import annotations

from .corpus import ByteCorpus, as_tensor
from .release_files import Layout

NAME = "wikitext"
VARIANTS = ("tokens", "raw")
SPLIT_FILES = {"train": "train", "val": "valid", "test": "test"}
FOLDERS = ("", "wikitext-103", "wikitext-2", "wikitext-103-raw", "wikitext-2-raw")


def load_wikitext(directory: str | None, *, variant: str = "tokens") -> ByteCorpus:
    """The three splits of the release in ``directory`` (see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"data {NAME!r}: variant must be one of {list(VARIANTS)}, got {variant!r}")
    layout = Layout(NAME, f"the WikiText release files wiki.{{train,valid,test}}.{variant}", FOLDERS)
    root = layout.root(directory, f"wiki.train.{variant}")
    splits = {}
    for split, name in SPLIT_FILES.items():
        path = layout.require(root, f"wiki.{name}.{variant}")
        data = layout.read(path)
        if len(data) < 2:
            raise ValueError(f"data {NAME!r}: {path} is empty")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"data {NAME!r}: {path} is not UTF-8 text (invalid byte at {error.start}) as the release is") from None
        splits[split] = as_tensor(data)
    return ByteCorpus(f"{NAME}:{directory}:variant={variant}", **splits)
