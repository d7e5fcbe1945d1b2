"""The files of a run directory (``tokenmix train --out DIR``): ``checkpoint.pt`` (``checkpoint.py``;
with ``--fsdp`` its tensors in ``shards/``, ``sharded.py``), ``metrics.jsonl`` (``metrics.py``), ``model/``
(``save_pretrained``'s folder, written at the end), for text, ``tokenizer.json``, and with ``--log`` what the
trackers keep there (``tokenmix.train.sinks``)."""

CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
MODEL_DIRECTORY = "model"
TENSORBOARD_DIRECTORY = "tensorboard"  # --log tensorboard: its event files (tokenmix.train.sinks)
LOG_RUNS_FILE = "log_runs.json"  # --log wandb / mlflow: the ids of the tracker's runs, so that a resume continues them
MLFLOW_DIRECTORY = "mlruns"  # --log mlflow without MLFLOW_TRACKING_URI: MLflow's file store
