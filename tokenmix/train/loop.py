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
The run's settings are ``config.py``'s, its checkpoint and resume ``checkpointing.py``'s, how it
stops early ``stopping.py``'s.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..compilation import compile_blocks
from ..data.batches import StreamBatches, step_generator, step_seed
from ..data.provenance import record_reads
from ..data.sources import DataSource, load_data
from ..data.tokenizer import TOKENIZER_FILE, Tokenizer
from ..devices import resolve_device
from ..models.model import ModelState, SequenceModel
from ..models.saving import save_pretrained
from ..parallel import ContextParallel, context_parallel_problems
from ..parallel.fsdp import full_state_dict, shard_model
from ..progress import progress_bar
from ..runs import Run, open_run
from ..runs.checkpoint import check_tokenizer_beside, checkpoint_tokenizer, model_config_of
from ..runs.layout import CHECKPOINT_FILE, METRICS_FILE, MODEL_DIRECTORY
from ..runs.sharded import SHARDS_KEY
from ..runtime import set_threads
from ..validation import set_finite_checks
from .checkpointing import CheckpointedRun, check_world_size
from .config import DEFAULT_WARMUP, TrainConfig, parse_interval
from .directory import append_metrics, check_directory, claim_directory, clean_stale, truncate_metrics
from .distributed import DistributedContext, check_launch, init_distributed
from .evaluate import EVAL_BATCH, describe
from .finetune import check_init_task, load_initial_weights
from .lock import RunLock, torchrun_rank
from .memory import GB, check_memory_fits, describe_memory, estimate_training_memory, peak_memory
from .objectives import check_task, objective_for
from .optim import build_optimizer
from .schedule import lr_multiplier
from .stopping import StopSignals, TrainingDiverged, TrainingInterrupted

CALIBRATION_STEPS = 5


class Trainer(CheckpointedRun):
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
        self.config = config
        self.out = Path(config.out)
        command = ("finetune" if config.init is not None else "train") + (" --resume" if resume else "")
        self.lock = RunLock(self.out, command) if torchrun_rank() == 0 else None  # first: a second writer is refused at once
        try:
            self._set_up(config, resume, progress, overwrite, pretrained, allow_data_change, memory_check)
        except BaseException:
            self.release_lock()
            raise

    def _set_up(self, config, resume, progress, overwrite, pretrained, allow_data_change, memory_check) -> None:
        self.progress = progress
        if config.threads:
            set_threads(config.threads)
        if config.check_finite:
            set_finite_checks(True)
        self.device = resolve_device(config.device)
        check_task(config.data, config.task)  # before the data is read or generated
        check_launch(config.context_parallel, config.fsdp)
        saved = self._load_checkpoint() if resume else None
        if config.init is not None and not resume:  # ``pretrained``: config.init already read (tokenmix finetune)
            self.pretrained = pretrained or open_run(config.init)
            check_init_task(self.pretrained, config.init, config.task)
        else:
            self.pretrained = None
        # A resumed run reads its data with the tokenizer it was trained with (kept in the checkpoint), a
        # fine-tuning run with its pretrained model's.
        if saved:
            kept = checkpoint_tokenizer(saved, self.out / CHECKPOINT_FILE)
            check_tokenizer_beside(self.out / CHECKPOINT_FILE, kept)
            tokenizer = kept or config.tokenizer
        elif self.pretrained:
            tokenizer = self.pretrained.tokenizer
            self.config = config = replace(config, tokenizer=tokenizer.name)
        else:
            tokenizer = config.tokenizer
        # the embedding rows a fine-tuned model keeps from its pretrained one (and a resumed one from itself)
        pretrained_vocab = self.pretrained and self.pretrained.config.vocab_size
        self.initial_vocab = model_config_of(saved, self.out / CHECKPOINT_FILE).vocab_size if saved else pretrained_vocab
        # fails before any training on a bad path; a BPE is learnt (or read from the cache) here
        with record_reads() as reads:
            self.data: DataSource = load_data(config.data, config.seq_len, config.seed, tokenizer, progress=progress)
        self.data_files = reads.fingerprints()  # kept in checkpoints: a resume on changed files is refused
        self.allow_data_change = allow_data_change
        self.objective = objective_for(self.data, config.task, config.seed)
        checkpoint = self._check_resume(saved) if resume else None
        # A resumed model is rebuilt from the checkpoint's resolved config, so defaults that changed since do not touch it.
        model_config = model_config_of(checkpoint, self.out / CHECKPOINT_FILE) if resume else config.model_config(self._model_fields())
        torch.manual_seed(config.seed)
        self.model = SequenceModel(model_config)
        if self.pretrained is not None:
            load_initial_weights(self.model, self.pretrained, config.init)
        if self.model.recurrent and not self.objective.streams:
            raise ValueError(f"data {config.data!r} needs a model that reads whole examples, not the segment-recurrent {config.model!r}")
        problems = context_parallel_problems(self.model, config.context_parallel) if config.context_parallel > 1 else []
        if problems:
            raise ValueError(f"--context-parallel {config.context_parallel}: " + "; ".join(problems))
        if not resume:
            check_directory(self.out, overwrite)  # on every rank, before any of them waits for the others
        self.context: DistributedContext = init_distributed(self.device, config.context_parallel, config.collective_timeout)
        if checkpoint is not None:
            check_world_size(checkpoint, self.context.world_size, self.out / CHECKPOINT_FILE)
        self.model.to(self.device)
        self.model.activation_checkpointing = config.activation_checkpointing
        self.model.precision = config.precision
        self.split: ContextParallel | None = None  # the model on this process's shard of each sequence
        self.evaluated = self.model  # what evaluation runs: the model, or split as in training with every logit gathered
        if config.context_parallel > 1:
            group, rank, size = self.context.context_group, self.context.context_rank, config.context_parallel
            self.split = ContextParallel(self.model, group, rank, size)
            if not self.model.recurrent:  # Transformer-XL streams are evaluated whole in each process
                self.evaluated = ContextParallel(self.model, group, rank, size, gather=True)
        self.memory = estimate_training_memory(self.model, self._probe_loss, config.batch_size, self.device)
        if memory_check:
            check_memory_fits(self.memory, self.device)
        self.removed_stale: list[Path] = []
        if self.context.is_main:  # only now, with every setting checked, is the directory touched
            if resume:
                self.removed_stale = clean_stale(self.out, checkpoint.get(SHARDS_KEY))
                truncate_metrics(self.out / METRICS_FILE, checkpoint["step"])
            else:
                self.removed_stale = claim_directory(self.out, overwrite)
                if self.tokenizer is not None:
                    self.tokenizer.save(self.out / TOKENIZER_FILE)
        self.context.barrier("the main process to set up the run directory")
        if config.compile:  # after the memory estimate (eager: a probe's other batch sizes would compile too), before FSDP or DDP
            compile_blocks(self.model)
        self.trained = self.model
        if config.fsdp:
            shard_model(self.model, self.context.shard_mesh, config.precision)
            self.trained = self.split or self.model
        elif self.context.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.trained = torch.nn.parallel.DistributedDataParallel(self.split or self.model, device_ids=ids)
        self.optimizer = build_optimizer(self.model, config.lr, config.weight_decay, (config.beta1, config.beta2))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")  # fp16's dynamic loss scaling
        self.step = 0
        self.last_evaluation: tuple | None = None  # (what was read at which step, its metrics): see ``evaluate``
        self.total_steps = config.steps
        self.train_seconds = 0.0  # wall time of training steps over every session of the run
        self.resumes: list[dict] = []
        self.segment_state: ModelState | None = None
        self.streams = None
        if self.model.recurrent:
            rank, groups = self.context.data_rank, self.context.data_parallel_size  # a context group reads one stream
            self.streams = StreamBatches(self.data.train, config.batch_size, config.seq_len, rank, groups)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._multiplier)
        self.save_steps, self.save_seconds = parse_interval(config.save_every)
        if checkpoint is not None:
            self._resume(checkpoint)

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The text's tokenizer (None for data with ids of its own)."""
        return getattr(self.data, "tokenizer", None)

    def _model_fields(self) -> dict:
        """What the data fixes of the model; a fine-tuned model keeps its pretrained embedding rows."""
        fields = self.objective.model_fields()
        if self.initial_vocab:
            fields["vocab_size"] = max(fields["vocab_size"], self.initial_vocab)
        return fields

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
        """A record in the run's metrics (the main process writes them)."""
        if self.context.is_main:
            append_metrics(self.out, record)

    # steps ----------------------------------------------------------------------------------
    def batch(self, step: int):
        """(inputs, targets, mask) of ``step``, the same on every resume."""
        generator = step_generator(self.config.seed, step, self.context.data_rank)
        return self.objective.batch(self.config.batch_size, self.config.seq_len, generator)

    def _probe_loss(self, copies: int) -> torch.Tensor:
        """The loss of ``copies`` copies of the run's largest example, computed as a training step does
        (segment-recurrent models: with a full memory, as every segment but a stream's first)."""
        example = self.objective.largest_example(self.config.seq_len)
        inputs, targets, mask = (None if t is None else t.to(self.device).expand(copies, *t.shape[1:]) for t in example)
        module = self.split or self.model
        if not self.model.recurrent:
            return self.step_loss(module, inputs, targets, mask)
        state = self.model.init_state(copies, device=self.device)
        with torch.no_grad():
            _, state = module(inputs, state=state, return_state=True)
        return self.loss_of(module(inputs, state=state, return_state=True)[0], targets, inputs.shape[-1])

    def step_loss(self, module, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The loss of ``module`` on a batch (``loss_of``)."""
        return self.loss_of(module(inputs, mask), targets, inputs.shape[-1])

    def loss_of(self, logits: torch.Tensor, targets: torch.Tensor, length: int) -> torch.Tensor:
        """The loss a step minimizes here: the batch's; with context parallelism over P processes, P times
        this process's term of it (``Objective.shard_loss``; DDP and FSDP average the gradients of every process:
        the P terms add up); ``length``: the sequences' (every process's shard of them)."""
        if self.split is None:
            return self.objective.loss(logits, targets)
        shard = self.split.shard(length)
        return self.objective.shard_loss(logits, targets, shard) * shard.size

    def train_step(self) -> tuple[float, int]:
        """One optimizer step: (loss, averaged over the processes gives the step's; real tokens of this rank's batch)."""
        torch.manual_seed(step_seed(self.config.seed, self.step, self.context.rank) + 1)  # dropout, apart from batches
        if self.streams is None:
            inputs, targets, mask = (None if t is None else t.to(self.device) for t in self.batch(self.step))
            loss = self.step_loss(self.trained, inputs, targets, mask)
            tokens = inputs.numel() if mask is None else int(mask.sum())
        else:
            inputs, targets, fresh = self.streams.batch(self.step)
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            state = self.model.init_state(inputs.shape[0], device=self.device) if fresh else self.segment_state
            logits, self.segment_state = self.trained(inputs, state=state, return_state=True)
            loss = self.loss_of(logits, targets, inputs.shape[-1])
            tokens = inputs.numel()
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.optimizer)  # skipped (fp16) when a gradient overflowed; the scale then shrinks
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        return loss.item(), tokens

    def evaluate(self, split: str = "val", max_tokens: int | None = None, length: int | None = None) -> dict:
        """The metrics of ``split``. Asked again at the same step for what the last evaluation read (the
        final validation right after the last step's, where the split is small: Path-X's 200 images
        take minutes), they are that evaluation's."""
        length = length or self.config.seq_len
        key = (self.step, split, length, self.objective.evaluation_extent(split, max_tokens))
        if self.last_evaluation is not None and self.last_evaluation[0] == key:
            return dict(self.last_evaluation[1])
        batch_size = min(EVAL_BATCH, self.config.batch_size)  # a batch that trains fits its forward pass
        metrics = self.objective.evaluate(self.evaluated, split, length=length, max_tokens=max_tokens, batch_size=batch_size)
        self.last_evaluation = (key, dict(metrics))
        return metrics

    def _steps_in_budget(self, seconds_per_step: float | None = None) -> int | None:
        """The step count the time budget allows: steps so far plus what the rest of it buys at this pace.

        90 % of ``minutes`` goes to training steps (the rest to validation); the pace is the run's
        own so far unless given (None when no step has been timed yet: calibrate first).
        """
        if seconds_per_step is None:
            if self.step == 0 or self.train_seconds <= 0:
                return None
            seconds_per_step = self.train_seconds / self.step
        budget = self.config.minutes * 60.0 * 0.9
        return max(self.step, self.step + int((budget - self.train_seconds) / seconds_per_step))

    def _calibrate(self, seconds_per_step: float) -> None:
        """Fix total_steps from the time budget at this rank's pace, the same on every rank (stored in
        checkpoints). Called after the first steps, and again at each validation with the pace of the
        whole run so far: the first steps can be slower or faster than the rest (caches filling, other
        load), and the budget is wall time."""
        total = self._steps_in_budget(self.context.all_reduce_mean(seconds_per_step))
        self.total_steps = int(self.context.all_reduce_max([float(total)])[0])  # ranks' clocks differ: agree on one count

    def _agree(self, *flags: bool) -> list[bool]:
        """The flags OR-ed over ranks, so every rank saves and stops together."""
        if not self.context.enabled:
            return list(flags)
        return [value > 0 for value in self.context.all_reduce_max([float(flag) for flag in flags])]

    def run(self) -> dict:
        """Train to ``total_steps``; returns the final validation metrics. The run's lock is released
        after it (nothing writes the run after training), so another process may resume it.

        Raises TrainingInterrupted after saving when SIGINT/SIGTERM arrives, TrainingDiverged on a
        non-finite loss (nothing saved over the last good checkpoint).
        """
        try:
            with self.context.faults("the other processes during training"):
                return self._train()
        finally:
            self.release_lock()

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _train(self) -> dict:
        config = self.config
        trained_tokens = 0  # this session's, on every rank
        bar = progress_bar(
            total=self.total_steps, initial=self.step, disable=not (self.progress and self.context.is_main), unit="step", dynamic_ncols=True
        )
        for path in self.removed_stale:
            bar.write(f"removed {path}: a save interrupted by a kill")
        if self.progress and self.context.is_main:
            bar.write(describe_memory(self.memory, self.device))
        step_seconds: list[float] = []
        started = last_save = time.perf_counter()
        with StopSignals() as signals:
            with bar:  # closed on any way out: a message after it starts on a line of its own
                while self.total_steps is None or self.step < self.total_steps:
                    tick = time.perf_counter()
                    loss, tokens = self.train_step()
                    loss = self.context.all_reduce_mean(loss)
                    elapsed = time.perf_counter() - tick
                    if not math.isfinite(loss):
                        raise TrainingDiverged(
                            f"the loss became {loss} at step {self.step}: training stopped, and the last good checkpoint "
                            f"in {str(self.out)!r} is kept. Start again with a lower --lr or a longer --warmup "
                            "(--overwrite replaces this run)"
                        )
                    self.train_seconds += elapsed
                    step_seconds.append(elapsed)
                    if self.total_steps is None and len(step_seconds) == CALIBRATION_STEPS:
                        self._calibrate(sum(step_seconds) / len(step_seconds))
                        bar.total = self.total_steps
                        if self.warmup_steps >= self.total_steps:
                            bar.write(
                                f"warning: --warmup {self.warmup_steps} reaches past the {self.total_steps} steps the time budget "
                                "allows: the learning rate will not reach --lr. Lower --warmup or raise --minutes"
                            )
                    tokens *= self.context.data_parallel_size  # data-parallel groups draw batches alike in size
                    trained_tokens += tokens
                    rate = tokens / elapsed
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
                    self.log(
                        {
                            "step": self.step,
                            "loss": loss,
                            "lr": self.scheduler.get_last_lr()[0],
                            "tokens_per_s": rate,
                            "elapsed_s": time.perf_counter() - started,
                        }
                    )
                    if self.step % config.eval_every == 0 and config.minutes is not None and (self.total_steps or 0) > self.step:
                        self._calibrate(self.train_seconds / self.step)
                        bar.total = self.total_steps
                    if self.step % config.eval_every == 0 or self.step == self.total_steps:
                        metrics = self.evaluate("val", config.eval_tokens)
                        self.log({"step": self.step, "split": "val", **metrics})
                        bar.write(f"step {self.step}: val {describe(metrics)}")
                    due = self.step % self.save_steps == 0 if self.save_steps else time.perf_counter() - last_save >= self.save_seconds
                    stop, due = self._agree(signals.received is not None, due or self.step == self.total_steps)
                    if due or stop:
                        self.save()
                        last_save = time.perf_counter()
                    if stop:
                        self.log({"step": self.step, "event": "interrupted", "signal": signals.received})
                        raise TrainingInterrupted(
                            f"stopped by {signals.received or 'a signal'} at step {self.step}; checkpoint saved to "
                            f"{str(self.out / CHECKPOINT_FILE)!r}. Continue with: tokenmix train --resume --out {self.out}"
                        )
            # Training is done and saved; a signal from here on lets the final evaluation and the model files finish.
            final = self.evaluate("val", config.final_eval_tokens)
            if step_seconds:
                seconds = sum(step_seconds) / len(step_seconds)
                final.update(seconds_per_step=seconds, train_tokens_per_s=trained_tokens / sum(step_seconds))
            final["session_minutes"] = (time.perf_counter() - self.started) / 60
            peak = peak_memory(self.device)
            if peak is not None:
                final["peak_memory_gb"] = peak / GB
            if self.memory.peak is not None:
                final["estimated_peak_gb"] = self.memory.peak / GB
            self.log({"step": self.step, "split": "val", "final": True, **final})
            weights = full_state_dict(self.model) if self.config.fsdp else None  # every process takes part
            if self.context.is_main:
                save_pretrained(self.model, self.out / MODEL_DIRECTORY, weights)
                if self.tokenizer is not None:
                    self.tokenizer.save(self.out / MODEL_DIRECTORY / TOKENIZER_FILE)
        self.context.barrier("the main process to save the final model")
        return final

    def whole_model(self) -> SequenceModel:
        """The trained model whole in this process: with ``--fsdp`` (each process holds a shard) the one
        ``run`` saved in the run's model folder, read back."""
        if not self.config.fsdp:
            return self.model
        model = open_run(self.out / MODEL_DIRECTORY, device=self.device).model
        model.precision = self.config.precision
        return model

    def close(self, wait: bool = True) -> None:
        """Leave the process group (``wait``: for the other processes first; not after an error). The DDP
        wrapper goes first, while its communicator is alive: gloo work it still held when freed at
        interpreter exit aborted a rank now and then. It sits in reference cycles, so dropping the
        reference is not enough: collect it now."""
        self.trained = self.model
        gc.collect()
        try:
            self.context.close(wait)
        finally:
            self.release_lock()
