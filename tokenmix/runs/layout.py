"""The files of a run directory (``tokenmix train --out DIR``): ``checkpoint.pt`` (``checkpoint.py``;
with ``--fsdp`` its tensors in ``shards/``, ``sharded.py``), ``metrics.jsonl`` (``metrics.py``), ``model/``
(``save_pretrained``'s folder, written at the end) and, for text, ``tokenizer.json``."""

CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
MODEL_DIRECTORY = "model"
