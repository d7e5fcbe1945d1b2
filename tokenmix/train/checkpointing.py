"""A run's checkpoint from the training side: what it holds, writing it (``RunCheckpoint.save``), and
resuming from it (``read_resumable``, ``check_resume``, ``RunCheckpoint.restore``): the settings a resume
may change, the data files it must find unchanged, the weights, optimizer, schedule, RNG and XL streams
it restores. With ``--fsdp`` the weights and optimizer state are written sharded
(``runs/sharded.py``); a resume reads either kind on any number of processes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..data.provenance import data_changes
from ..data.tokenizer import TOKENIZER_FILE, Tokenizer
from ..models.model import ModelState, SequenceModel
from ..models.saving import save_pretrained
from ..parallel.dims import ParallelDims
from ..parallel.fsdp import full_state_dict, local_part
from ..runs import open_run
from ..runs.checkpoint import load_checkpoint, save_checkpoint
from ..runs.layout import CHECKPOINT_FILE, MODEL_DIRECTORY
from ..runs.sharded import SHARDS_KEY, load_shards, remove_unused_shards, save_shards, shards_of
from ..runs.weights import load_weights
from .config import TrainConfig
from .directory import resume_changes
from .resume import check_resumable, load_optimizer_state, restore_rng_state, rng_state, segment_state_of, train_config_of
from .stopping import RunFinished, TrainingDiverged


def check_world_size(checkpoint: dict, world_size: int, path: Path) -> None:
    """A checkpoint with XL streams resumes on as many processes as wrote it (one stream each)."""
    streams = checkpoint.get("segment_states") or []
    written_by = len(streams)
    if any(stream is not None for stream in streams) and written_by != world_size:
        raise ValueError(f"--resume: checkpoint {str(path)!r} was written by {written_by} processes; resume with as many")


def read_resumable(out: Path) -> dict:
    """The checkpoint of the run in ``out``, checked to hold what a resume reads."""
    path = out / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(f"--resume: no checkpoint at {str(path)!r}")
    state = load_checkpoint(path)
    check_resumable(state, path)
    return state


def check_resume(state: dict, config: TrainConfig, model_fields: dict, data_files: dict, allow_data_change: bool) -> TrainConfig:
    """``config`` for resuming the checkpoint ``state`` of the run in ``config.out`` (its model options spelled as
    the run spelled them when they resolve alike); ``state["changes"]``: the settings this resume changes.
    ValueError for refused changes; ``model_fields``: what the data fixes of the model (``Objective.model_fields``)."""
    out = Path(config.out)
    path = out / CHECKPOINT_FILE
    saved = asdict(train_config_of(state, path))  # settings added since it was written read as their defaults
    requested = asdict(config)
    saved_options = saved["options"]
    if _resolved_options(config, saved_options, model_fields) == _resolved_options(config, config.options, model_fields):
        config = replace(config, options=saved_options)  # the same model, kept as the run spelled it
        requested["options"] = saved_options
    changes = resume_changes(saved, requested, state["step"])
    finished = state["total_steps"] is not None and state["step"] >= state["total_steps"]
    model_written = (out / MODEL_DIRECTORY / "config.json").is_file()  # absent: stopped before its final evaluation
    if finished and model_written and not {"steps", "minutes"} & set(changes):
        raise RunFinished(
            f"--resume: the run in {str(out)!r} already finished at step {state['step']}; "
            f"give --steps > {state['step']} (or a longer --minutes) to train further"
        )
    if config.fsdp and shards_of(state, path) is None:
        raise ValueError(
            f"--resume --fsdp reads sharded checkpoints; {str(path)!r} was written without --fsdp: resume it without "
            "--fsdp (--no-fsdp), and its next checkpoints stay whole"
        )
    state["changes"] = changes
    _check_data_files(state, config.data, data_files, allow_data_change)
    return config


def _check_data_files(state: dict, data: str, data_files: dict, allow_data_change: bool) -> None:
    """ValueError naming every data file that differs from the checkpoint's record of it (size, SHA-256),
    unless ``allow_data_change``; the change is then noted in the run's resume history."""
    saved = state.get("data_files")
    changes = [] if saved is None else data_changes(saved, data_files)  # None: written before files were recorded
    if changes and not allow_data_change:
        raise ValueError(
            f"--resume: the data of {data!r} changed since the checkpoint ({'; '.join(changes[:5])}"
            f"{'; ...' if len(changes) > 5 else ''}): the run would go on with other data. Restore the files, or pass "
            "--allow-data-change to continue on the new data"
        )
    if changes:
        state["changes"]["data_files"] = changes


def _resolved_options(config: TrainConfig, options: dict, model_fields: dict) -> dict | None:
    """Every model option ``config`` with these ``options`` resolves to (None if they resolve to no model)."""
    try:
        return replace(config, options=options).model_config(model_fields).options
    except ValueError:
        return None


@dataclass
class Progress:
    """How far a run has trained: what a checkpoint records of it besides the model and the optimizer."""

    step: int = 0
    total_steps: int | None = None
    train_seconds: float = 0.0  # wall time of training steps over every session of the run
    resumes: list[dict] = field(default_factory=list)  # each resume that changed a setting: its step and the changes
    segment_state: ModelState | None = None  # this process's XL stream

    def __iter__(self):
        """The fields in order: ``step, total_steps, train_seconds, resumes, segment_state = progress``."""
        return iter((self.step, self.total_steps, self.train_seconds, self.resumes, self.segment_state))


@dataclass
class RunCheckpoint:
    """The checkpoint of the run in ``config.out``, and what it saves and restores: the model, its optimizer,
    learning-rate ``scheduler`` and fp16 loss ``scaler``, the RNG; ``tokenizer`` and ``data_files`` (the files
    the data was read from) are recorded so a resume reads the same."""

    config: TrainConfig
    dims: ParallelDims
    model: SequenceModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    tokenizer: Tokenizer | None
    data_files: dict

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    def state(self, progress: Progress) -> dict:
        """What a checkpoint holds, but the XL streams (``save`` gathers them from every process) and,
        with ``--fsdp``, the weights and optimizer state (``save`` writes them sharded)."""
        return {
            "model_config": self.model.config.to_dict(),
            "train_config": asdict(self.config),
            "model": {} if self.config.fsdp else self.model.state_dict(),
            "optimizer": {} if self.config.fsdp else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),  # fp16's loss scale and its growth tracker; empty otherwise
            "step": progress.step,
            "total_steps": progress.total_steps,
            "train_seconds": progress.train_seconds,
            "resumes": progress.resumes,
            "rng": rng_state(),
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json(),
            "data_files": self.data_files,
        }

    def save(self, progress: Progress) -> None:
        """Write the checkpoint (all ranks take part); refuses to replace a good one with non-finite weights."""
        finite = all(bool(torch.isfinite(local_part(p)).all()) for p in self.model.parameters())
        if self.dims.agree(not finite)[0]:
            raise TrainingDiverged(
                f"the weights became non-finite at step {progress.step}; the last good checkpoint in {str(self.out)!r} is kept"
            )
        stream = progress.segment_state
        segment_states = self.dims.gather_objects(None if stream is None else stream.to("cpu").to_plain())
        if self.config.fsdp:  # every process writes its shards first
            shards, settings = save_shards(self.out, progress.step, self.model, self.optimizer, self.dims.is_main, self.dims.barrier)
        if self.dims.is_main:
            state = {**self.state(progress), "segment_states": segment_states}
            if self.config.fsdp:
                state[SHARDS_KEY], state["optimizer"] = shards, settings
            save_checkpoint(self.out / CHECKPOINT_FILE, state)
            remove_unused_shards(self.out, state.get(SHARDS_KEY))

    def save_model(self) -> None:
        """The trained model (and the tokenizer) in the run's model folder, whole (every process takes part)."""
        weights = full_state_dict(self.model) if self.config.fsdp else None
        if self.dims.is_main:
            save_pretrained(self.model, self.out / MODEL_DIRECTORY, weights)
            if self.tokenizer is not None:
                self.tokenizer.save(self.out / MODEL_DIRECTORY / TOKENIZER_FILE)

    def whole_model(self) -> SequenceModel:
        """The trained model whole in this process: with ``--fsdp`` (each process holds a shard) the one
        ``save_model`` saved, read back."""
        if not self.config.fsdp:
            return self.model
        model = open_run(self.out / MODEL_DIRECTORY, device=self.dims.device).model
        model.precision = self.config.precision
        return model

    def restore(self, state: dict) -> Progress:
        """Put the checkpoint ``state`` back into the model, optimizer, schedule, loss scaler and RNG; returns
        the progress it recorded, with this process's XL stream."""
        path = self.out / CHECKPOINT_FILE
        shards = shards_of(state, path)
        if shards is not None:
            load_shards(shards, state["optimizer"], self.model, self.optimizer)
            self.scheduler.load_state_dict(state["scheduler"])
        else:
            load_weights(self.model, state["model"], f"checkpoint {str(path)!r}")
            load_optimizer_state(self.optimizer, self.scheduler, state, path)
        if state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        restore_rng_state(state["rng"], path)
        streams = state.get("segment_states") or []  # one per process for XL models (check_world_size), else none or Nones
        rank = self.dims.rank
        stream = segment_state_of(streams[rank] if rank < len(streams) else None, self.model, self.config.batch_size, path, rank)
        return Progress(
            state["step"],
            state["total_steps"],
            state.get("train_seconds", 0.0),
            list(state.get("resumes", [])),
            None if stream is None else stream.to(self.dims.device),
        )
