"""The ``--data`` argument: every source a run can read, by name.

- ``shakespeare``, ``PATH`` (a .txt file or a directory of them), ``bytes:PATH``: byte corpora
  for language modelling (``corpus.py``), held in memory.
- ``DIR[:windows=across|within]`` that ``tokenmix prepare`` wrote (it holds ``manifest.json``): token shards
  read in place, in the tokenizer the folder holds; training windows may cross documents (the default) or
  stay within one (``prepared.py``).
- ``wikitext:DIR[:variant=tokens|raw]``: WikiText-103 / WikiText-2 from ``wiki.{train,valid,test}.tokens``
  (or ``.raw``), a byte corpus (``wikitext.py``).
- ``glue-TASK:DIR[:max_length=N][:val_fraction=F][:dev=matched|mismatched]``: a GLUE task
  (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte) from its release TSVs (``glue_source.py``).
- ``assoc-recall[:vocab=V][,pairs=K]``: associative recall, generated (``recall.py``).
- ``listops[:key=value...]``: ListOps generated as the Long Range Arena does, seeded by the run's
  seed; options ``train``, ``val``, ``test`` (counts), ``min_length``, ``max_length``, ``max_depth``,
  ``max_args``, official by default (``listops.py``). ``listops:DIR``: the release's
  ``listops-1000/basic_{train,val,test}.tsv``.
- ``lra-text:DIR[:max_length=N][:val_fraction=F]``: IMDB bytes from the aclImdb release (``lra_text.py``).
- ``lra-retrieval:DIR[:max_length=N]``: AAN document pairs from ``tsv_data/new_aan_pairs.*.tsv``
  (``lra_retrieval.py``).
- ``lra-image:DIR[:val_fraction=F]``: grayscale CIFAR-10 from ``cifar-10-batches-py/`` (``lra_image.py``).
- ``shapes[:size=N][:train=N][:val=N][:test=N]``: outline shapes on a size x size grid, generated
  (``shapes.py``), a small image task for 2-D mixers.
- ``lra-pathfinder:DIR[:resolution=32|64|128|256][:difficulty=easy|intermediate|hard][:limit=N]``:
  Pathfinder and Path-X (resolution 128) images (``lra_pathfinder.py``).
- ``pathfinder-gen[:resolution=R][:difficulty=D][:train=N][:val=N][:test=N]``: Pathfinder images generated
  at the LRA's settings for ``resolution`` 32 (default), 64, 128 (Path-X) or 256 and ``difficulty`` easy,
  intermediate or hard (default), seeded by the run's seed and cached; 20,000 / 2,000 / 2,000 images by
  default, a CPU's share of the LRA's 160,000 / 20,000 / 20,000 (``pathfinder_gen.py``).

Classification sources give a ``ClassificationData``; their ``length`` is set by their own options
(the ``length`` argument shapes the associative-recall task only).

``tokenizer`` (``--tokenizer``: bytes, bpe:V, a tokenizer.json path, or a ``Tokenizer``) applies to
text: corpora become a ``TokenCorpus`` and GLUE texts are tokenized with it; a BPE is learnt from
the training split. The other tasks have their own token ids and take bytes only.
"""

from __future__ import annotations

from .corpus import load_corpus
from .examples import ClassificationData
from .glue_source import glue_task, load_glue_task, training_text
from .listops import load_listops
from .lra_image import load_lra_image
from .lra_pathfinder import load_lra_pathfinder
from .lra_retrieval import load_lra_retrieval
from .lra_text import load_lra_text
from .pathfinder_gen import load_pathfinder_gen
from .prepared import open_prepared, prepared_folder
from .recall import PREFIX as RECALL
from .recall import AssociativeRecall, parse_recall
from .shapes import load_shapes
from .spec import parse_source
from .tokenized import TokenCorpus, resolve_tokenizer, split_bytes, tokenize_corpus
from .tokenizer import BYTES, Tokenizer
from .wikitext import NAME as WIKITEXT
from .wikitext import load_wikitext

DataSource = TokenCorpus | AssociativeRecall | ClassificationData
GLUE_OPTIONS = {"max_length": int, "val_fraction": float, "dev": str}

# name -> (loader, its options and their types, whether it takes the run's seed)
TASKS = {
    "listops": (load_listops, dict.fromkeys(("train", "val", "test", "min_length", "max_length", "max_depth", "max_args"), int), True),
    "lra-text": (load_lra_text, {"max_length": int, "val_fraction": float}, True),
    "lra-retrieval": (load_lra_retrieval, {"max_length": int}, False),
    "lra-image": (load_lra_image, {"val_fraction": float}, True),
    "lra-pathfinder": (load_lra_pathfinder, {"resolution": int, "difficulty": str, "limit": int}, True),
    "shapes": (load_shapes, dict.fromkeys(("size", "train", "val", "test"), int), True),
    "pathfinder-gen": (load_pathfinder_gen, {"resolution": int, "difficulty": str, **dict.fromkeys(("train", "val", "test"), int)}, True),
}


def load_data(source: str, length: int, seed: int = 0, tokenizer: str | Tokenizer = BYTES, progress: bool = False) -> DataSource:
    """Load ``--data`` (see the module docstring); ValueError for anything unusable, before any training."""
    kind = source_kind(source)
    if kind not in ("corpus", "glue") and not (tokenizer == BYTES or getattr(tokenizer, "is_bytes", False)):
        raise ValueError(f"data {source!r} has its own token ids; --tokenizer applies to text corpora and GLUE tasks (use bytes)")
    if kind == "glue":
        spec = parse_source(source, source.split(":", 1)[0])
        options = spec.take_all(GLUE_OPTIONS)
        text = training_text(spec) if isinstance(tokenizer, str) and tokenizer.startswith("bpe:") else None
        return load_glue_task(spec, resolve_tokenizer(tokenizer, text, progress), seed, **options)
    for name, (loader, kinds, seeded) in TASKS.items():
        spec = parse_source(source, name)
        if spec is not None:
            options = spec.take_all(kinds)
            return loader(spec.directory, **options, **({"seed": seed} if seeded else {}))
    if kind == "recall":
        return parse_recall(source, length, seed)
    if prepared_folder(source) is not None:
        return open_prepared(source, tokenizer)
    wikitext = parse_source(source, WIKITEXT)
    corpus = load_wikitext(wikitext.directory, **wikitext.take_all({"variant": str})) if wikitext else load_corpus(source)
    tokenizer = resolve_tokenizer(tokenizer, split_bytes(corpus, "train"), progress, f"data {corpus.source!r} (its train split)")
    return tokenize_corpus(corpus, tokenizer, progress)


def source_kind(source: str) -> str:
    """ "classification", "glue", "recall" or "corpus": what ``load_data(source)`` gives, from the name
    alone (so a task that does not fit the data is refused before any data is read or generated)."""
    if glue_task(source) is not None:
        return "glue"
    if any(parse_source(source, name) is not None for name in TASKS):
        return "classification"
    return "recall" if parse_source(source, RECALL) is not None else "corpus"
