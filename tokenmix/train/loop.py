"""The training loop: single process or torchrun DDP, periodic validation, atomic checkpoints.

Batches are drawn from generators seeded by (seed, step, data-parallel rank) and dropout by
(seed, step, rank), so a resumed run sees exactly the batches an uninterrupted run would, on any
number of processes. With ``--context-parallel P`` (``tokenmix.parallel``) each sequence is split
over P processes that read the same batch: one data-parallel group sees the batches of one process. Recurrent
models (Transformer-XL family) read contiguous streams segment by segment instead, carrying
their memory from step to step; the memory is saved in checkpoints so resuming stays exact.

Nothing trained is lost: a checkpoint is written every ``save_every`` (steps, or minutes of wall
time), when training ends, and on SIGINT (Ctrl-C) or SIGTERM, after which the run stops with
``TrainingInterrupted``. A non-finite loss stops the run with ``TrainingDiverged`` and leaves the
last good checkpoint in place. Run directories follow ``directory.py``: never two runs in one.
The run's settings are ``config.py``'s, what it reads and builds before training ``setup.py``'s,
how its model spreads over processes ``tokenmix.parallel.parallelize``'s, its checkpoint and resume
``checkpointing.py``'s, how it stops early ``stopping.py``'s, the trackers its metrics also go to (``--log``) ``sinks.py``'s.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import torch

from ..data.batches import Part, StreamBatches, step_generator, step_seed
from ..data.tokenizer import Tokenizer
from ..models.model import SequenceModel
from ..ops.fused_toeplitz import kernels
from ..parallel import ContextParallel
from ..parallel.parallelize import ParallelConfig, parallelize
from ..runs import Run
from ..runs.layout import CHECKPOINT_FILE
from .checkpointing import Progress, RunCheckpoint, read_resumable
from .config import DEFAULT_WARMUP, TrainConfig
from .directory import append_metrics
from .evaluate import EVAL_BATCH, describe
from .lock import RunLock, torchrun_rank
from .memory import GB, MemoryEstimate, check_memory_fits, describe_memory, estimate_training_memory, peak_memory
from .objectives import Objective
from .optim import build_optimizer
from .schedule import lr_multiplier, steps_in_budget
from .session import Session
from .setup import build_model, configure_process, join_processes, prepare_directory, read_run_data, start_trackers
from .stopping import StopSignals, TrainingDiverged, TrainingInterrupted

CALIBRATION_STEPS = 5


def loss_on_shards(objective: Objective, split: ContextParallel | None, logits: torch.Tensor, targets: torch.Tensor, length: int):
    """The loss a step minimizes: the batch's; with context parallelism (``split`` over P processes), P times
    this process's term of it (``Objective.shard_loss``; DDP and FSDP average the gradients of every process:
    the P terms add up); ``length``: the sequences' (every process's shard of them)."""
    if split is None:
        return objective.loss(logits, targets)
    shard = split.shard(length)
    return objective.shard_loss(logits, targets, shard) * shard.size


def shard_part(objective: Objective, split: ContextParallel | None, seq_len: int) -> Part:
    """The positions [start, stop) of each window this process reads: its shard's, where context parallelism splits
    the sequences and the objective can read parts (``Objective.reads_parts``); None: whole windows."""
    if split is None or not objective.reads_parts:
        return None
    shard = split.shard(seq_len)
    return shard.start, shard.stop


def shard_inputs(part: Part, seq_len: int) -> dict:
    """What tells a context-parallel module that the tokens it is given are its shard's alone (of sequences of ``seq_len``)."""
    return {} if part is None else {"length": seq_len}


def probe_loss(
    objective: Objective, model: SequenceModel, split: ContextParallel | None, copies: int, seq_len: int, device
) -> torch.Tensor:
    """The loss of ``copies`` copies of the run's largest example of ``seq_len`` tokens, computed as a training step does
    (by ``model``, or its ``split`` with context parallelism, reading its shard's part; segment-recurrent models: with a
    full memory, as every segment but a stream's first)."""
    module, part = split or model, shard_part(objective, split, seq_len)
    example = objective.largest_example(seq_len, part)
    inputs, targets, mask = (None if t is None else t.to(device).expand(copies, *t.shape[1:]) for t in example)
    length, given = inputs.shape[-1] if part is None else seq_len, shard_inputs(part, seq_len)
    if not model.recurrent:
        return loss_on_shards(objective, split, module(inputs, mask, **given), targets, length)
    state = model.init_state(copies, device=device)
    with torch.no_grad():
        _, state = module(inputs, state=state, return_state=True, **given)
    return loss_on_shards(objective, split, module(inputs, state=state, return_state=True, **given)[0], targets, length)


def update(loss: torch.Tensor, model: SequenceModel, optimizer, scaler: torch.amp.GradScaler, scheduler, grad_clip: float) -> None:
    """The weights moved by ``loss``'s gradients: backward (scaled for fp16), clipped to norm ``grad_clip`` (0: not
    clipped), the optimizer's step and the learning rate's."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # skipped (fp16) when a gradient overflowed; the scale then shrinks
    scaler.update()
    scheduler.step()


def divergence(loss: float, step: int, out: Path) -> TrainingDiverged:
    """What stops a run whose ``loss`` became non-finite at ``step``."""
    return TrainingDiverged(
        f"the loss became {loss} at step {step}: training stopped, and the last good checkpoint "
        f"in {str(out)!r} is kept. Start again with a lower --lr or a longer --warmup "
        "(--overwrite replaces this run)"
    )


def memory_metrics(memory: MemoryEstimate, device: torch.device) -> dict:
    """The memory this process peaked at, and the peak ``memory`` estimated, in GB (where known)."""
    metrics, peak = {}, peak_memory(device)
    if peak is not None:
        metrics["peak_memory_gb"] = peak / GB
    if memory.peak is not None:
        metrics["estimated_peak_gb"] = memory.peak / GB
    return metrics


def interruption(signal: str | None, step: int, out: Path) -> TrainingInterrupted:
    """What stops a run that ``signal`` interrupted at ``step``, its checkpoint saved."""
    return TrainingInterrupted(
        f"stopped by {signal or 'a signal'} at step {step}; checkpoint saved to "
        f"{str(out / CHECKPOINT_FILE)!r}. Continue with: tokenmix train --resume --out {out}"
    )


class Trainer:
    """Owns one run: model, optimizer, schedule, data and the run directory.

    ``resume=True`` continues the run in ``config.out`` from its checkpoint; ``config`` must then
    equal the checkpoint's settings except for ``directory.RESUMABLE`` ones. ``overwrite=True`` replaces
    a run already in ``config.out``; without it, such a directory is refused. ``pretrained``: the
    model ``config.init`` names, when the caller has read it already.
    """

    def __init__(
        self,
        config: TrainConfig,
        resume: bool = False,
        progress: bool = True,
        overwrite: bool = False,
        pretrained: Run | None = None,
        allow_data_change: bool = False,
        memory_check: bool = True,
    ):
        self.started = time.perf_counter()  # this session's wall time runs from reading the data to the saved model
        self.config, self.out, self.progress = config, Path(config.out), progress
        command = ("finetune" if config.init is not None else "train") + (" --resume" if resume else "")
        self.lock = RunLock(self.out, command) if torchrun_rank() == 0 else None  # first: a second writer is refused at once
        try:
            self.device = configure_process(config)
            saved = read_resumable(self.out) if resume else None
            run = read_run_data(config, saved, pretrained, allow_data_change, progress)  # the data
            self.config = config = run.config
            self.data, self.data_files, self.objective = run.data, run.data_files, run.objective
            self.tokenizer: Tokenizer | None = getattr(self.data, "tokenizer", None)  # None for data with ids of its own
            self.model = build_model(config, saved, run.model_fields, run.pretrained, self.objective)  # the model
            self.dims = join_processes(config, self.device, saved, overwrite)  # parallelized over torchrun's processes
            self.model.to(self.device)
            self.model.precision = config.precision
            parallelism = ParallelConfig(config.activation_checkpointing, config.compile, config.fsdp, config.precision)
            prepare = functools.partial(self._prepare_run, saved=saved, overwrite=overwrite, memory_check=memory_check)
            with kernels(config.kernels):  # the memory estimate's steps, and a compiled model's probe of the fused kernels
                self.parallel = parallelize(self.model, self.dims, parallelism, prepare)
            self.part = shard_part(self.objective, self.parallel.split, config.seq_len)  # of each window, what this process reads
            self._build_optimizer()
            self.sinks = start_trackers(config, self.model, self.out, saved, self.dims.is_main)  # --log, ended by ``run``
            if saved is not None:
                self._resume(saved)
        except BaseException:
            self.release_lock()
            raise

    def _prepare_run(self, split: ContextParallel | None, saved: dict | None, overwrite: bool, memory_check: bool) -> None:
        """The last checks, while the model is eager and whole (``parallelize``'s ``before_wrapping``): the memory a step
        needs (its model ``split`` as a step runs it); only then is the run directory touched, by the main process."""

        def loss_of(copies: int) -> torch.Tensor:
            return probe_loss(self.objective, self.model, split, copies, self.config.seq_len, self.device)

        self.memory = estimate_training_memory(self.model, loss_of, self.config.batch_size, self.device)
        if memory_check:
            check_memory_fits(self.memory, self.device)
        self.removed_stale = prepare_directory(self.out, saved, overwrite, self.tokenizer) if self.dims.is_main else []
        self.dims.barrier("the main process to set up the run directory")

    def _build_optimizer(self) -> None:
        """Step 0 of the run (segment-recurrent models read their streams, one per data-parallel group); AdamW, its
        learning-rate schedule, fp16's dynamic loss scaling, and the checkpoint that saves them."""
        config, dims = self.config, self.dims
        self.step, self.total_steps, self.train_seconds, self.resumes, self.segment_state = 0, config.steps, 0.0, [], None
        self.last_evaluation: tuple | None = None  # (what was read at which step, its metrics): see ``evaluate``
        recurrent = self.model.recurrent  # a context group reads one stream
        self.streams = StreamBatches(self.data.train, config.batch_size, config.seq_len, dims.data_rank, dims.dp) if recurrent else None
        self.optimizer = build_optimizer(self.model, config.lr, config.weight_decay, (config.beta1, config.beta2))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._multiplier)
        parts = (self.model, self.optimizer, self.scheduler, self.scaler, self.tokenizer, self.data_files)
        self.checkpoint = RunCheckpoint(config, dims, *parts)

    # schedule -----------------------------------------------------------------------------
    @property
    def warmup_steps(self) -> int:
        """``--warmup``, or by default ``DEFAULT_WARMUP`` steps, shortened to a ninth of a shorter run."""
        if self.config.warmup is not None:
            return self.config.warmup
        return DEFAULT_WARMUP if self.total_steps is None else min(DEFAULT_WARMUP, self.total_steps // 9)

    def _multiplier(self, step: int) -> float:
        total = self.total_steps or max(step + 1, self.warmup_steps + 1)
        return lr_multiplier(step, total, self.warmup_steps, self.config.schedule, self.config.min_lr_ratio)

    def log(self, record: dict) -> None:
        """A record in the run's metrics, and its metrics to the trackers of ``--log`` (the main process writes them)."""
        if self.dims.is_main:
            append_metrics(self.out, record)
            self.sinks.log(record)

    # steps ----------------------------------------------------------------------------------
    def batch(self, step: int):
        """(inputs, targets, mask) of ``step``, the same on every resume."""
        generator = step_generator(self.config.seed, step, self.dims.data_rank)
        return self.objective.batch(self.config.batch_size, self.config.seq_len, generator, self.part)

    def train_step(self) -> tuple[float, int]:
        """One optimizer step: (loss, averaged over the processes gives the step's; real tokens of this rank's batch)."""
        torch.manual_seed(step_seed(self.config.seed, self.step, self.dims.rank) + 1)  # dropout, apart from batches
        part, seq_len = self.part, self.config.seq_len
        given = shard_inputs(part, seq_len)
        if self.streams is None:
            inputs, targets, mask = (None if t is None else t.to(self.device) for t in self.batch(self.step))
            logits = self.parallel.trained(inputs, mask, **given)
        else:
            inputs, targets, fresh = self.streams.batch(self.step, part)
            inputs, targets, mask = inputs.to(self.device), targets.to(self.device), None
            state = self.model.init_state(inputs.shape[0], device=self.device) if fresh else self.segment_state
            logits, self.segment_state = self.parallel.trained(inputs, state=state, return_state=True, **given)
        length = inputs.shape[-1] if part is None else seq_len
        tokens = int(mask.sum()) if mask is not None else inputs.numel() // inputs.shape[-1] * length  # of whole windows
        loss = loss_on_shards(self.objective, self.parallel.split, logits, targets, length)
        update(loss, self.model, self.optimizer, self.scaler, self.scheduler, self.config.grad_clip)
        self.step += 1
        return loss.item(), tokens

    def evaluate(self, split: str = "val", max_tokens: int | None = None, length: int | None = None) -> dict:
        """The metrics of ``split``. Asked again at the same step for what the last evaluation read (the final validation
        right after the last step's, where the split is small: Path-X's 200 images take minutes), they are that evaluation's."""
        length = length or self.config.seq_len
        key = (self.step, split, length, self.objective.evaluation_extent(split, max_tokens))
        if self.last_evaluation is not None and self.last_evaluation[0] == key:
            return dict(self.last_evaluation[1])
        batch_size = min(EVAL_BATCH, self.config.batch_size)  # a batch that trains fits its forward pass
        metrics = self.objective.evaluate(self.parallel.evaluated, split, length=length, max_tokens=max_tokens, batch_size=batch_size)
        self.last_evaluation = (key, dict(metrics))
        return metrics

    def _calibrate(self, seconds_per_step: float) -> None:
        """Fix total_steps from the time budget at this rank's pace, the same on every rank (stored in checkpoints).
        Called after the first steps, and again at each validation with the pace of the whole run so far: the first
        steps can be slower or faster than the rest (caches filling, other load), and the budget is wall time."""
        total = steps_in_budget(self.config.minutes, self.step, self.train_seconds, self.dims.all_reduce_mean(seconds_per_step))
        self.total_steps = int(self.dims.all_reduce_max([float(total)])[0])  # ranks' clocks differ: agree on one count

    def run(self) -> dict:
        """Train to ``total_steps``; returns the final validation metrics. The run's lock is released after it (nothing
        writes the run after training), so another process may resume it. Raises TrainingInterrupted after saving when
        SIGINT/SIGTERM arrives, TrainingDiverged on a non-finite loss (nothing saved over the last good checkpoint). The
        trackers' runs (``--log``) end with it; its steps run on the ``kernels`` of the run's settings."""
        try:
            with self.sinks, self.dims.faults("the other processes during training"), kernels(self.config.kernels):
                return self._train()
        finally:
            self.release_lock()

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _train(self) -> dict:
        dims, shown = self.dims, self.progress and self.dims.is_main
        notes = [f"removed {path}: a save interrupted by a kill" for path in self.removed_stale]
        notes += [describe_memory(self.memory, self.device)] if shown else []
        session = Session(self.step, self.total_steps, shown, self.config.save_every, time.perf_counter(), notes)
        with StopSignals() as signals:
            with session.bar:  # closed on any way out: a message after it starts on a line of its own
                while self.total_steps is None or self.step < self.total_steps:
                    tick = time.perf_counter()
                    loss, tokens = self.train_step()
                    loss, elapsed = dims.all_reduce_mean(loss), time.perf_counter() - tick
                    if not math.isfinite(loss):
                        raise divergence(loss, self.step, self.out)
                    self.train_seconds += elapsed
                    session.step_seconds.append(elapsed)
                    rate = session.show(loss, tokens * dims.dp, elapsed)  # data-parallel groups draw batches alike in size
                    lr, elapsed_s = self.scheduler.get_last_lr()[0], time.perf_counter() - session.started
                    self.log({"step": self.step, "loss": loss, "lr": lr, "tokens_per_s": rate, "elapsed_s": elapsed_s})
                    self._fix_length(session)
                    self._validate(session.bar)
                    due = session.save_due(self.step, time.perf_counter()) or self.step == self.total_steps
                    stop, due = dims.agree(signals.received is not None, due)
                    if due or stop:
                        self.save()
                        session.last_save = time.perf_counter()
                    if stop:
                        self.log({"step": self.step, "event": "interrupted", "signal": signals.received})
                        raise interruption(signals.received, self.step, self.out)
            # Training is done and saved; a signal from here on lets the final evaluation and the model files finish.
            final = self._finish(session)
        dims.barrier("the main process to save the final model")
        return final

    def _fix_length(self, session: Session) -> None:
        """A --minutes run's step count: fixed from the pace of its first steps (a warning when the warmup outlasts
        it), re-fixed at each validation from the pace of the whole run so far."""
        config = self.config
        if self.total_steps is None and len(session.step_seconds) == CALIBRATION_STEPS:
            self._calibrate(session.seconds_per_step)
            if self.warmup_steps >= self.total_steps:
                session.bar.write(
                    f"warning: --warmup {self.warmup_steps} reaches past the {self.total_steps} steps the time budget "
                    "allows: the learning rate will not reach --lr. Lower --warmup or raise --minutes"
                )
        if self.step % config.eval_every == 0 and config.minutes is not None and (self.total_steps or 0) > self.step:
            self._calibrate(self.train_seconds / self.step)
        session.bar.total = self.total_steps

    def _validate(self, bar) -> None:
        """Every ``eval_every`` steps, and at the last: the validation metrics, logged and shown."""
        if self.step % self.config.eval_every == 0 or self.step == self.total_steps:
            metrics = self.evaluate("val", self.config.eval_tokens)
            self.log({"step": self.step, "split": "val", **metrics})
            bar.write(f"step {self.step}: val {describe(metrics)}")

    def _finish(self, session: Session) -> dict:
        """The final validation with this session's pace and memory, logged; the model saved in the run's model folder."""
        final = self.evaluate("val", self.config.final_eval_tokens)
        final.update(session.pace(), session_minutes=(time.perf_counter() - self.started) / 60)
        final.update(memory_metrics(self.memory, self.device))
        self.log({"step": self.step, "split": "val", "final": True, **final})
        self.checkpoint.save_model()
        return final

    # checkpoints ----------------------------------------------------------------------------
    def save(self) -> None:
        """Write the checkpoint (all ranks take part); refuses to replace a good one with non-finite weights."""
        self.checkpoint.save(Progress(self.step, self.total_steps, self.train_seconds, self.resumes, self.segment_state))

    def _resume(self, saved: dict) -> None:
        """Continue from the checkpoint ``saved`` (checked by ``check_resume``): a new run length gets its own
        schedule from this step on, and the resume is recorded with what it changed."""
        self.step, self.total_steps, self.train_seconds, self.resumes, self.segment_state = self.checkpoint.restore(saved)
        changes = saved["changes"]
        if "steps" in changes or "minutes" in changes:
            self.total_steps = self.config.steps or steps_in_budget(self.config.minutes, self.step, self.train_seconds)
            for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
                group["lr"] = base_lr * self._multiplier(self.step)  # the schedule of the new run length, from this step on
        if changes:
            self.resumes.append({"step": self.step, "changed": changes})
        self.log({"step": self.step, "event": "resume", "changed": changes})

    def whole_model(self) -> SequenceModel:
        """The trained model whole in this process: with ``--fsdp`` (each process holds a shard) the one
        ``run`` saved in the run's model folder, read back."""
        return self.checkpoint.whole_model()

    def close(self, wait: bool = True) -> None:
        """Leave the process group (``wait``: for the other processes first; not after an error). The DDP
        wrapper goes first, while its communicator is alive: gloo work it still held when freed at
        interpreter exit aborted a rank now and then."""
        self.parallel.drop_ddp()
        try:
            self.dims.close(wait)
        finally:
            self.release_lock()
