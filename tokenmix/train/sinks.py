"""Trackers a run's metrics go to besides ``metrics.jsonl`` (``--log tensorboard,wandb,mlflow``).

``metrics.jsonl`` stays the run's record. Each sink gets every numeric metric of each record at the record's
step, named by what it measured (``record_metrics``: ``train/loss``, ``val/loss``, ``final/peak_memory_gb``), and
the run's resolved config once per session. Only the main process logs, as it alone writes ``metrics.jsonl``.

- ``tensorboard``: event files in ``<run>/tensorboard/`` (``torch.utils.tensorboard``), the config as a text summary.
- ``wandb``: ``wandb.init(config=...)``; ``WANDB_MODE``, ``WANDB_PROJECT`` (default ``tokenmix``), ``WANDB_DIR``
  (default: the run directory) and ``WANDB_NAME`` (default: its name) are the user's to set.
- ``mlflow``: ``MlflowClient`` on ``MLFLOW_TRACKING_URI``, by default a file store in ``<run>/mlruns``, in the
  experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``tokenmix``); the config as params, flattened
  (``train.lr``) and stringified within MLflow's length limit.

A resume continues the tracker's run: TensorBoard purges what a killed session logged after the checkpoint;
wandb (``resume="allow"``) and MLflow find their run by the id kept in ``<run>/log_runs.json``, and records up
to the step they already hold are not sent again. Each backend's library is imported when its sink starts (the
optional extras ``tokenmix[tensorboard]``, ``[wandb]``, ``[mlflow]``). A sink that cannot start stops the run
before it trains; one that fails while training warns once and is dropped, and training goes on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings
from pathlib import Path

from ..io.files import write_json_atomic
from ..runs.layout import LOG_RUNS_FILE, MLFLOW_DIRECTORY, TENSORBOARD_DIRECTORY
from .stopping import TrainingInterrupted

SINKS = ("tensorboard", "wandb", "mlflow")
FLUSH_SECONDS = 10  # TensorBoard: events reach the disk at least this often
DEFAULT_PROJECT = "tokenmix"  # the wandb project and MLflow experiment when the environment names none


def record_metrics(record: dict) -> dict[str, float]:
    """The numeric metrics of a ``metrics.jsonl`` record, named ``GROUP/KEY``: GROUP is ``train`` for a step's
    record, its split (``val``) for a validation's, ``final`` for the final validation's (which also holds the
    session's pace and memory). Events (resume, interrupted) hold none."""
    group = "final" if record.get("final") else record.get("split", "train")
    numbers = {key: value for key, value in record.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    return {f"{group}/{key}": float(value) for key, value in numbers.items() if key != "step"}


def flat_settings(config: dict, prefix: str = "") -> dict[str, str | int | float | bool]:
    """``config`` flattened to dotted keys (``train.lr``, ``model.options.mixer.decay``); values other than
    strings, numbers and booleans as JSON text (``null``, lists)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            plain = isinstance(value, (str, int, float, bool))
            flat[f"{prefix}{key}"] = value if plain else json.dumps(value, sort_keys=True)
    return flat


def missing_extra(name: str) -> str:
    return f'--log {name} needs its optional extra: pip install "tokenmix[{name}]"'


def check_installed(names) -> None:
    """ValueError naming the extra to install for the first of ``names`` whose library is missing (before the run
    reads its data: ``Sink.start`` imports it)."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ValueError(missing_extra(name))


class Sink:
    """One tracker. ``run_id``: the tracker's run this run directory continues (None: a new one; ``start`` sets
    it); ``logged_to``: the last step the tracker already holds, whose records a resumed run does not send again."""

    name = ""

    def __init__(self, run_id: str | None = None):
        self.run_id, self.logged_to = run_id, -1

    def start(self, config: dict, run_dir: Path, step: int) -> None:
        """Open the tracker's run; ``config``: the run's resolved settings; ``step``: the step training goes on from."""
        raise NotImplementedError

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self, outcome: str = "finished") -> None:
        raise NotImplementedError


class TensorBoardSink(Sink):
    name = "tensorboard"

    def start(self, config: dict, run_dir: Path, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # a resumed session hides the events a killed one wrote after the checkpoint (TensorBoard's purge_step)
        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIRECTORY), purge_step=step + 1 if step else None, flush_secs=FLUSH_SECONDS)
        text = json.dumps(config, indent=2, sort_keys=True)
        self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), global_step=step)  # a code block

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, outcome: str = "finished") -> None:
        self.writer.close()


class WandbSink(Sink):
    name = "wandb"

    def start(self, config: dict, run_dir: Path, step: int) -> None:
        import wandb

        defaults = {"WANDB_PROJECT": ("project", DEFAULT_PROJECT), "WANDB_DIR": ("dir", str(run_dir)), "WANDB_NAME": ("name", run_dir.name)}
        options = dict(value for variable, value in defaults.items() if not os.environ.get(variable))
        self.run = wandb.init(id=self.run_id, resume="allow", reinit="create_new", **options)
        self.run.config.update(config, allow_val_change=True)  # a resume may change how long the run trains
        self.run_id, self.logged_to = self.run.id, self.run.step - 1  # wandb's step: the next one its history takes

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, outcome: str = "finished") -> None:
        self.run.finish(exit_code={"finished": 0, "interrupted": 130}.get(outcome, 1))


class MlflowSink(Sink):
    name = "mlflow"
    STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}

    def start(self, config: dict, run_dir: Path, step: int) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / MLFLOW_DIRECTORY).resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 has file stores opt in
        self.client = MlflowClient(uri)
        run = None
        if self.run_id is not None:
            try:
                run = self.client.get_run(self.run_id)
            except MlflowException:  # not in this store (another MLFLOW_TRACKING_URI): a new run
                run = None
        if run is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run = self.client.create_run(experiment_id, run_name=run_dir.name)
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
            self.logged_to = max((metric.step for metric in self.client.get_metric_history(run.info.run_id, "train/loss")), default=-1)
        self.run_id = run.info.run_id
        # params cannot change: a resumed run adds those it lacks, and metrics.jsonl records what a resume changed
        params = [Param(key, self._text(value, MAX_PARAM_VAL_LENGTH)) for key, value in flat_settings(config).items()]
        params = [param for param in params if param.key not in run.data.params]
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + MAX_PARAMS_TAGS_PER_BATCH])

    @staticmethod
    def _text(value, limit: int) -> str:
        text = value if isinstance(value, str) else json.dumps(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in metrics.items()])

    def close(self, outcome: str = "finished") -> None:
        self.client.set_terminated(self.run_id, status=self.STATUS[outcome])


SINK_TYPES = {sink.name: sink for sink in (TensorBoardSink, WandbSink, MlflowSink)}


def read_log_runs(run_dir: Path) -> dict[str, str]:
    """The trackers' run ids kept in ``log_runs.json`` ({} when there is none); ValueError naming a damaged one."""
    path = run_dir / LOG_RUNS_FILE
    if not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        ids = None
    if not (isinstance(ids, dict) and all(isinstance(key, str) and isinstance(value, str) for key, value in ids.items())):
        raise ValueError(
            f"{str(path)!r} is not a JSON object of tracker run ids (names to strings): delete it to have --log start new tracker runs"
        )
    return ids


class LogSinks:
    """The sinks of a run (none by default), fed every record the run writes to ``metrics.jsonl``."""

    def __init__(self, sinks: list[Sink] | None = None):
        self.sinks = sinks or []

    @classmethod
    def open(cls, names, run_dir: Path, config: dict, step: int) -> LogSinks:
        """Start the sinks ``names`` for the run in ``run_dir`` going on from ``step``, continuing the trackers' runs
        ``log_runs.json`` names, and keep their ids there. ValueError when one cannot start (the ones started are closed)."""
        ids = read_log_runs(run_dir)
        opened = cls()
        try:
            for name in names:
                sink = SINK_TYPES[name](ids.get(name))
                try:
                    sink.start(config, run_dir, step)
                except ImportError:
                    raise ValueError(missing_extra(name)) from None
                except Exception as error:
                    raise ValueError(f"--log {name} could not start: {type(error).__name__}: {error}") from error
                opened.sinks.append(sink)
        except BaseException:
            opened.close("failed")
            raise
        kept = {**ids, **{sink.name: sink.run_id for sink in opened.sinks if sink.run_id is not None}}
        if kept != ids:
            write_json_atomic(run_dir / LOG_RUNS_FILE, kept)
        return opened

    def log(self, record: dict) -> None:
        """Send ``record``'s metrics to every sink; one that fails is dropped with a warning, and training goes on."""
        metrics, step = record_metrics(record), record.get("step", 0)
        for sink in list(self.sinks) if metrics else []:
            if step > sink.logged_to:
                try:
                    sink.log(metrics, step)
                except Exception as error:
                    self.sinks.remove(sink)
                    warnings.warn(
                        f"--log {sink.name} failed at step {step} ({type(error).__name__}: {error}): nothing more goes to "
                        f"{sink.name} in this session; training goes on, and metrics.jsonl keeps every record",
                        stacklevel=2,
                    )
                    self._close(sink, "failed", quiet=True)  # one warning a sink

    def __enter__(self) -> LogSinks:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        """The trackers' runs end as the session does: finished, interrupted (a signal, Ctrl-C) or failed."""
        self.close(
            "finished" if kind is None else "interrupted" if issubclass(kind, (TrainingInterrupted, KeyboardInterrupt)) else "failed"
        )

    def close(self, outcome: str = "finished") -> None:
        """End every sink's run as ``outcome``: finished, interrupted (a signal) or failed; a sink that fails to close warns."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            self._close(sink, outcome)

    @staticmethod
    def _close(sink: Sink, outcome: str, quiet: bool = False) -> None:
        try:
            sink.close(outcome)
        except Exception as error:
            if not quiet:
                warnings.warn(f"--log {sink.name} failed to close its run ({type(error).__name__}: {error})", stacklevel=3)
