"""The checkpointing side of a ``Trainer``: what a checkpoint holds, writing it, and resuming from it
(the settings a resume may change, the data files it must find unchanged, the weights, optimizer,
schedule, RNG and XL streams it restores). With ``--fsdp`` the weights and optimizer state are
written sharded (``runs/sharded.py``); a resume reads either kind on any number of processes."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..data.provenance import data_changes
from ..parallel.fsdp import local_part
from ..runs.checkpoint import load_checkpoint, save_checkpoint
from ..runs.layout import CHECKPOINT_FILE, MODEL_DIRECTORY
from ..runs.sharded import SHARDS_KEY, load_shards, remove_unused_shards, save_shards, shards_of
from ..runs.weights import load_weights
from .directory import resume_changes
from .resume import check_resumable, load_optimizer_state, restore_rng_state, rng_state, segment_state_of, train_config_of
from .stopping import RunFinished, TrainingDiverged


def check_world_size(checkpoint: dict, world_size: int, path: Path) -> None:
    """A checkpoint with XL streams resumes on as many processes as wrote it (one stream each)."""
    streams = checkpoint.get("segment_states") or []
    written_by = len(streams)
    if any(stream is not None for stream in streams) and written_by != world_size:
        raise ValueError(f"--resume: checkpoint {str(path)!r} was written by {written_by} processes; resume with as many")


class CheckpointedRun:
    """Mixin of ``Trainer``: its checkpoint and resume (the attributes are the Trainer's)."""

    def state(self) -> dict:
        """What a checkpoint holds, but the XL streams (``save`` gathers them from every process) and,
        with ``--fsdp``, the weights and optimizer state (``save`` writes them sharded)."""
        return {
            "model_config": self.model.config.to_dict(),
            "train_config": asdict(self.config),
            "model": {} if self.config.fsdp else self.model.state_dict(),
            "optimizer": {} if self.config.fsdp else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),  # fp16's loss scale and its growth tracker; empty otherwise
            "step": self.step,
            "total_steps": self.total_steps,
            "train_seconds": self.train_seconds,
            "resumes": self.resumes,
            "rng": rng_state(),
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json(),
            "data_files": self.data_files,
        }

    def _load_checkpoint(self) -> dict:
        path = self.out / CHECKPOINT_FILE
        if not path.is_file():
            raise ValueError(f"--resume: no checkpoint at {str(path)!r}")
        state = load_checkpoint(path)
        check_resumable(state, path)
        return state

    def _check_resume(self, state: dict) -> dict:
        """The checkpoint ``state`` with the settings this resume changes (ValueError for refused ones)."""
        saved = asdict(train_config_of(state, self.out / CHECKPOINT_FILE))  # settings added since it was written read as their defaults
        requested = asdict(self.config)
        saved_options = saved["options"]
        if self._resolved_options(saved_options) == self._resolved_options(self.config.options):
            self.config = replace(self.config, options=saved_options)  # the same model, kept as the run spelled it
            requested["options"] = saved_options
        changes = resume_changes(saved, requested, state["step"])
        finished = state["total_steps"] is not None and state["step"] >= state["total_steps"]
        model_written = (self.out / MODEL_DIRECTORY / "config.json").is_file()  # absent: stopped before its final evaluation
        if finished and model_written and not {"steps", "minutes"} & set(changes):
            raise RunFinished(
                f"--resume: the run in {str(self.out)!r} already finished at step {state['step']}; "
                f"give --steps > {state['step']} (or a longer --minutes) to train further"
            )
        path = self.out / CHECKPOINT_FILE
        if self.config.fsdp and shards_of(state, path) is None:
            raise ValueError(
                f"--resume --fsdp reads sharded checkpoints; {str(path)!r} was written without --fsdp: resume it without "
                "--fsdp (--no-fsdp), and its next checkpoints stay whole"
            )
        state["changes"] = changes
        self._check_data_files(state)
        return state

    def _check_data_files(self, state: dict) -> None:
        """ValueError naming every data file that differs from the checkpoint's record of it (size, SHA-256),
        unless ``allow_data_change``; the change is then noted in the run's resume history."""
        saved = state.get("data_files")
        changes = [] if saved is None else data_changes(saved, self.data_files)  # None: written before files were recorded
        if changes and not self.allow_data_change:
            raise ValueError(
                f"--resume: the data of {self.config.data!r} changed since the checkpoint ({'; '.join(changes[:5])}"
                f"{'; ...' if len(changes) > 5 else ''}): the run would go on with other data. Restore the files, or pass "
                "--allow-data-change to continue on the new data"
            )
        if changes:
            state["changes"]["data_files"] = changes

    def _resolved_options(self, options: dict) -> dict | None:
        """Every model option the run's settings with these ``options`` resolve to (None if they resolve to no model)."""
        try:
            return replace(self.config, options=options).model_config(self._model_fields()).options
        except ValueError:
            return None

    def _resume(self, state: dict) -> None:
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
        self.step, self.total_steps = state["step"], state["total_steps"]
        self.train_seconds = state.get("train_seconds", 0.0)
        self.resumes = list(state.get("resumes", []))
        changes = state["changes"]
        if "steps" in changes or "minutes" in changes:
            self.total_steps = self.config.steps if self.config.steps is not None else self._steps_in_budget()
            for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
                group["lr"] = base_lr * self._multiplier(self.step)  # the schedule of the new run length, from this step on
        restore_rng_state(state["rng"], path)
        streams = state.get("segment_states") or []  # one per process for XL models (check_world_size), else none or Nones
        stream = streams[self.context.rank] if self.context.rank < len(streams) else None
        segment_state = segment_state_of(stream, self.model, self.config.batch_size, path, self.context.rank)
        self.segment_state = None if segment_state is None else segment_state.to(self.device)
        if changes:
            self.resumes.append({"step": self.step, "changed": changes})
        self.log({"step": self.step, "event": "resume", "changed": changes})

    def save(self) -> None:
        """Write the checkpoint (all ranks take part); refuses to replace a good one with non-finite weights."""
        finite = all(bool(torch.isfinite(local_part(p)).all()) for p in self.model.parameters())
        if self._agree(not finite)[0]:
            raise TrainingDiverged(
                f"the weights became non-finite at step {self.step}; the last good checkpoint in {str(self.out)!r} is kept"
            )
        segment_states = self.context.gather_objects(None if self.segment_state is None else self.segment_state.to("cpu").to_plain())
        if self.config.fsdp:  # every process writes its shards first
            shards, settings = save_shards(self.out, self.step, self.model, self.optimizer, self.context.is_main, self.context.barrier)
        if self.context.is_main:
            state = {**self.state(), "segment_states": segment_states}
            if self.config.fsdp:
                state[SHARDS_KEY], state["optimizer"] = shards, settings
            save_checkpoint(self.out / CHECKPOINT_FILE, state)
            remove_unused_shards(self.out, state.get(SHARDS_KEY))
