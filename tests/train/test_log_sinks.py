"""``--log tensorboard,wandb,mlflow``: every metric of metrics.jsonl reaches each tracker, read back with the tracker's
own reader (offline: TensorBoard event files, wandb's offline run files, an MLflow file store), a resumed run
continues the tracker's run, and a tracker that is missing or fails is handled as docs/training.md says."""

import importlib.util
import json
import shutil
import struct
import sys

import pytest
from conftest import TINY_RUN, usage_error

from tokenmix.cli import main
from tokenmix.runs.layout import LOG_RUNS_FILE, TENSORBOARD_DIRECTORY
from tokenmix.runs.metrics import read_metrics
from tokenmix.train import TrainConfig, Trainer
from tokenmix.train.directory import check_directory, claim_directory
from tokenmix.train.sinks import SINKS, LogSinks, record_metrics

INSTALLED = [name for name in SINKS if importlib.util.find_spec(name) is not None]


def needs(name: str):
    return pytest.mark.skipif(name not in INSTALLED, reason=f'needs the {name} extra: pip install "tokenmix[{name}]"')


def series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's metrics as the trackers name them: {tag: [(step, value), ...]}."""
    tags: dict[str, list] = {}
    for record in records:
        for tag, value in record_metrics(record).items():
            tags.setdefault(tag, []).append((record["step"], value))
    return tags


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, text_file_module):
    """A run logged to every installed tracker over three sessions: steps 1-2; a resume to step 4 whose last
    checkpoint is then replaced by the step-2 one (as if it was killed after logging steps 3-4 but saving at 2);
    and a resume from step 2 to 4 that logs steps 3-4 again. Returns (run directory, metrics.jsonl's records)."""
    root = tmp_path_factory.mktemp("logged")
    out = root / "run"
    common = ["--data", text_file_module, *TINY_RUN, "--eval-every", "2", "--threads", "1", "--sample-tokens", "0"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(root))
        patch.setenv("WANDB_SILENT", "true")
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded, so that what the sink sets is undone afterwards
        patch.delenv("MLFLOW_ALLOW_FILE_STORE")
        assert main(["train", *common, "--steps", "2", "--log", ",".join(INSTALLED) or "none", "--out", str(out)]) == 0
        shutil.copy(out / "checkpoint.pt", root / "step-2.pt")
        assert main(["train", "--resume", "--steps", "4", "--out", str(out), "--sample-tokens", "0"]) == 0
        shutil.copy(root / "step-2.pt", out / "checkpoint.pt")
        assert main(["train", "--resume", "--steps", "4", "--out", str(out), "--sample-tokens", "0"]) == 0
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r and "split" not in r] == [1, 2, 3, 4]  # each step once
    return out, records


@pytest.fixture(scope="module")
def text_file_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(("To be, or not to be, that is the question. " * 200).encode())
    return str(path)


# what the third session measured anew at steps 3-4 (time, memory): a tracker that kept the second session's differs there
RETIMED = {"train/tokens_per_s", "train/elapsed_s", "final/seconds_per_step", "final/train_tokens_per_s", "final/session_minutes"}
RETIMED |= {"final/peak_memory_gb", "final/estimated_peak_gb"}


def check_series(logged: dict[str, list[tuple[int, float]]], records: list[dict], exact=float, keeps_first=False) -> None:
    """The tracker holds every train/ and val/ metric of metrics.jsonl at its step once (``exact``: the value as the
    tracker stores it), and the final metrics at the last step; ``keeps_first``: it kept what it held of steps 3-4
    (the second session's, not sent again), so only the steps of RETIMED tags are compared."""
    expected = series(records)
    for tag, points in expected.items():
        held, wanted = (logged[tag][-1:], points[-1:]) if tag.startswith("final/") else (logged[tag], points)
        if keeps_first and tag in RETIMED:
            assert [step for step, _ in held] == [step for step, _ in wanted], tag
        else:
            assert held == [(step, exact(value)) for step, value in wanted], tag
    assert {"train/loss", "train/lr", "train/tokens_per_s", "val/loss", "final/loss", "final/peak_memory_gb"} <= set(expected)


@needs("tensorboard")
def test_tensorboard_event_files_hold_the_metrics(logged_run):
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, records = logged_run
    events = EventAccumulator(str(out / TENSORBOARD_DIRECTORY), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    logged = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    check_series(logged, records, exact=lambda value: float(np.float32(value)))  # TensorBoard keeps float32
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.003' in config and '"model": "tnn"' in config


@needs("mlflow")
def test_mlflow_file_store_holds_the_metrics_and_params_of_one_run(logged_run):
    from mlflow.tracking import MlflowClient

    out, records = logged_run
    run_id = json.loads((out / LOG_RUNS_FILE).read_text())["mlflow"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient((out / "mlruns").as_uri())
        run = client.get_run(run_id)
        history = {tag: client.get_metric_history(run_id, tag) for tag in run.data.metrics}
    logged = {tag: sorted((m.step, m.value) for m in metrics) for tag, metrics in history.items()}
    check_series(logged, records, keeps_first=True)  # steps 3-4 once: the third session did not send again what the store held
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.lr"] == "0.003" and run.data.params["train.steps"] == "2"  # params stay as the run began
    assert run.data.params["train.log"] == json.dumps(INSTALLED) and run.data.params["model.name"] == "tnn"


def wandb_records(path):
    """The records of a wandb run file (``run-ID.wandb``), which wandb writes in LevelDB's log format: a 7-byte
    header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks (CRC-32C, length, type: 1 full,
    2 first, 3 middle, 4 last) holding ``wandb_internal_pb2.Record`` messages. wandb 0.31 ships no reader in Python."""
    from wandb.proto import wandb_internal_pb2

    data, block, header = path.read_bytes(), 32768, 7
    assert struct.unpack("<4sHB", data[:header]) == (b":W&B", 0xBEE1, 0)
    index, pending = header, b""
    while index + header <= len(data):
        if block - index % block < header:  # the rest of a block is padding
            index += block - index % block
            continue
        _, length, kind = struct.unpack("<IHB", data[index : index + header])
        if kind == 0:
            break
        pending += data[index + header : index + header + length]
        index += header + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


@needs("wandb")
def test_wandb_offline_runs_hold_the_metrics_and_config_under_one_id(logged_run):
    out, records = logged_run
    run_id = json.loads((out / LOG_RUNS_FILE).read_text())["wandb"]
    files = sorted(out.parent.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 3 and all(file.name == f"run-{run_id}.wandb" for file in files)  # one run, resumed twice
    steps, configs = {}, []
    for file in files:  # offline, each session logs what it trains; `wandb sync` keeps the first value of a step
        for record in wandb_records(file):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                values = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
                for tag, value in values.items():
                    steps.setdefault(tag, {}).setdefault(values["_step"], value)
            elif kind == "run":
                configs.append({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "config":
                configs[-1].update({item.key: json.loads(item.value_json) for item in record.config.update})
    check_series({tag: sorted(held.items()) for tag, held in steps.items()}, records, keeps_first=True)
    assert [config["train"]["steps"] for config in configs] == [2, 4, 4] and configs[0]["model"]["name"] == "tnn"


def test_log_refuses_unknown_trackers(tmp_path, capsys):
    error = usage_error(["train", "--log", "tensorboard,neptune", "--out", str(tmp_path / "run")], capsys)
    assert "argument --log: must be comma-separated names among none, tensorboard, wandb, mlflow, got 'tensorboard,neptune'" in error
    with pytest.raises(ValueError, match=r"log must be a list of names among none, tensorboard, wandb, mlflow, got \['neptune'\]"):
        TrainConfig(log=["neptune"])
    error = usage_error(["train", "--log", "none,wandb", "--out", str(tmp_path / "run")], capsys)
    assert error == "tokenmix train: error: --log none (no tracker) goes alone, got none,wandb\n"
    assert TrainConfig(log="wandb,tensorboard,wandb").log == ["wandb", "tensorboard"] and TrainConfig(log=["none"]).log is None
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", SINKS)
def test_a_missing_tracker_names_its_extra_before_the_run_starts(name, text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    error = usage_error(["train", "--data", text_file, *TINY_RUN, "--steps", "1", "--log", name, "--out", str(tmp_path / "run")], capsys)
    assert error == f'tokenmix train: error: --log {name} needs its optional extra: pip install "tokenmix[{name}]"\n'
    assert not (tmp_path / "run").exists()


def test_a_resume_without_the_trackers_turns_them_off_with_log_none(logged_run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(logged_run[0], out)
    for name in SINKS:
        monkeypatch.setitem(sys.modules, name, None)  # a machine without the extras
    resume = ["train", "--resume", "--steps", "5", "--out", str(out), "--sample-tokens", "0"]
    if INSTALLED:
        assert f"--log {INSTALLED[0]} needs its optional extra" in usage_error(resume, capsys)
    events = sorted((out / TENSORBOARD_DIRECTORY).iterdir()) if (out / TENSORBOARD_DIRECTORY).exists() else []
    assert main([*resume, "--log", "none"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "split" not in r][-2:] == [4, 5]
    assert events == (sorted((out / TENSORBOARD_DIRECTORY).iterdir()) if events else [])  # nothing more was logged there


@needs("wandb")
def test_a_tracker_whose_import_fails_at_start_names_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ValueError, match=r'^--log wandb needs its optional extra: pip install "tokenmix\[wandb\]"$'):
        LogSinks.open(["wandb"], tmp_path, {}, 0)


@needs("mlflow")
def test_a_tracker_that_fails_while_training_warns_once_and_training_goes_on(text_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = dict(data=text_file, dim=8, depth=1, seq_len=16, batch_size=2, steps=3, warmup=0, eval_every=2, eval_tokens=64)
    config = TrainConfig(**settings, threads=1, out=str(tmp_path / "run"), log=["mlflow"])
    trainer = Trainer(config, progress=False)
    store = tmp_path / "run" / "mlruns"
    shutil.rmtree(next(folder for folder in store.glob("*/*") if folder.name == trainer.sinks.sinks[0].run_id))  # the store lost the run
    with pytest.warns(UserWarning) as warned:
        final = trainer.run()
    messages = [str(warning.message) for warning in warned if "--log" in str(warning.message)]
    assert len(messages) == 1 and messages[0].startswith("--log mlflow failed at step 1 (MlflowException: ")
    assert "training goes on, and metrics.jsonl keeps every record" in messages[0]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records if "split" not in r] == [1, 2, 3] and records[-1]["final"] and final["loss"] > 0


def test_overwrite_replaces_the_trackers_files_of_the_run(tmp_path):
    out = tmp_path / "run"
    (out / TENSORBOARD_DIRECTORY).mkdir(parents=True)
    (out / LOG_RUNS_FILE).write_text('{"wandb": "abc"}')
    with pytest.raises(ValueError, match=r"already holds a run \(tensorboard, log_runs.json\)"):
        check_directory(out, overwrite=False)
    claim_directory(out, overwrite=True)
    assert not (out / TENSORBOARD_DIRECTORY).exists() and not (out / LOG_RUNS_FILE).exists()


def test_record_metrics_name_each_number_by_what_it_measured():
    assert record_metrics({"step": 3, "loss": 2.5, "lr": 1e-3, "tokens_per_s": 100}) == {
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "train/tokens_per_s": 100.0,
    }
    assert record_metrics({"step": 4, "split": "val", "loss": 2.0, "tokens": 64}) == {"val/loss": 2.0, "val/tokens": 64.0}
    assert record_metrics({"step": 4, "split": "val", "final": True, "loss": 1.5, "peak_memory_gb": 0.5}) == {
        "final/loss": 1.5,
        "final/peak_memory_gb": 0.5,
    }
    assert record_metrics({"step": 4, "event": "resume", "changed": {"steps": [2, 4]}}) == {}
