"""The training loop: single process or torchrun DDP, periodic validation, atomic checkpoints.

Batches and dropout are drawn from generators seeded by (seed, step, rank), so a resumed run
sees exactly the batches an uninterrupted run would, on any number of processes. Recurrent
models (Transformer-XL family) read contiguous streams segment by segment instead, carrying
their memory from step to step; the memory is saved in checkpoints so resuming stays exact.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.batches import StreamBatches, lm_batch, mlm_batch, step_generator, step_seed
from ..data.corpus import BYTE_VOCAB
from ..data.recall import AssociativeRecall
from ..data.sources import DataSource, load_data
from ..models.config import ModelConfig
from ..models.model import SegmentState, SequenceModel
from ..models.pretrained import save_pretrained
from .checkpoint import CHECKPOINT_FILE, load_checkpoint, restore_rng_state, rng_state, save_checkpoint
from .distributed import DistributedContext, init_distributed
from .evaluate import describe, evaluate_lm, evaluate_mlm, evaluate_recall
from .schedule import SCHEDULES, lr_multiplier

TRAIN_TASKS = ("lm", "mlm")
CALIBRATION_STEPS = 5


@dataclass
class TrainConfig:
    """Every knob of a run; the defaults are the README demo (TNN char LM on Shakespeare)."""

    model: str = "tnn"
    task: str = "lm"
    data: str = "shakespeare"
    dim: int = 128
    depth: int = 4
    seq_len: int = 512
    batch_size: int = 16
    steps: int | None = 450
    minutes: float | None = None
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    schedule: str = "cosine"
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    dropout: float = 0.0
    seed: int = 0
    threads: int | None = None
    eval_every: int = 150
    eval_tokens: int = 32768
    device: str = "auto"
    out: str = "runs/demo"
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TRAIN_TASKS:
            raise ValueError(f"task must be one of {list(TRAIN_TASKS)} for training, got {self.task!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if (self.steps is None) == (self.minutes is None):
            raise ValueError("give exactly one of steps and minutes (a time budget)")
        for name in ("seq_len", "batch_size", "eval_every", "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup < 0 or self.grad_clip < 0:
            raise ValueError("lr must be > 0, min_lr_ratio in [0, 1], warmup >= 0, grad_clip >= 0")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def model_config(self, vocab_size: int = BYTE_VOCAB) -> ModelConfig:
        """The model for data of ``vocab_size`` tokens (masked LM adds the mask token, id vocab_size)."""
        vocab = vocab_size + (1 if self.task == "mlm" else 0)
        options = {"dropout": self.dropout, **self.options}
        return ModelConfig(self.model, self.task, vocab, self.dim, self.depth, None, options)


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when every process on this node gets its own GPU (torchrun's LOCAL_WORLD_SIZE), else CPU."""
    if name == "auto":
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return torch.device("cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= processes else "cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}") from None


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only: not on biases, norms or the (tied) embedding."""
    groups = {True: [], False: []}
    for name, parameter in model.named_parameters():
        groups[parameter.dim() >= 2 and "embedding" not in name].append(parameter)
    return [{"params": groups[True], "weight_decay": weight_decay}, {"params": groups[False], "weight_decay": 0.0}]


def _to_device(state: SegmentState | None, device) -> SegmentState | None:
    if state is None:
        return None
    return SegmentState([memory.to(device) for memory in state.memory], state.position)


class Trainer:
    """Owns one run: model, optimizer, schedule, data and the run directory."""

    def __init__(self, config: TrainConfig, resume: bool = False, progress: bool = True):
        self.config = config
        self.out = Path(config.out)
        self.progress = progress
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        self.data: DataSource = load_data(config.data, config.seq_len, config.seed)  # fails before any training on a bad path
        self.recall = isinstance(self.data, AssociativeRecall)
        if self.recall and config.task != "lm":
            raise ValueError(f"data {config.data!r} is a next-token task: use --task lm")
        self.context: DistributedContext = init_distributed(self.device)
        torch.manual_seed(config.seed)
        self.model = SequenceModel(config.model_config(self.data.vocab_size)).to(self.device)
        if self.recall and self.model.recurrent:
            raise ValueError(f"data {config.data!r} needs a model that reads whole examples, not the segment-recurrent {config.model!r}")
        self.trained = self.model
        if self.context.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.trained = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer = torch.optim.AdamW(
            _parameter_groups(self.model, config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2)
        )
        self.step = 0
        self.total_steps = config.steps
        self.segment_state: SegmentState | None = None
        self.streams = None
        if self.model.recurrent:
            rank, world = self.context.rank, self.context.world_size
            self.streams = StreamBatches(self.data.train, config.batch_size, config.seq_len, rank, world)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._multiplier)
        if resume:
            self._resume()

    # schedule -----------------------------------------------------------------------------
    def _multiplier(self, step: int) -> float:
        total = self.total_steps or max(step + 1, self.config.warmup + 1)
        return lr_multiplier(step, total, self.config.warmup, self.config.schedule, self.config.min_lr_ratio)

    # state ----------------------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "model_config": self.model.config.to_dict(),
            "train_config": asdict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "total_steps": self.total_steps,
            "rng": rng_state(),
        }

    def _resume(self) -> None:
        path = self.out / CHECKPOINT_FILE
        if not path.is_file():
            raise ValueError(f"--resume: no checkpoint at {str(path)!r}")
        state = load_checkpoint(path)
        if state["model_config"] != self.model.config.to_dict():
            raise ValueError(f"--resume: the checkpoint in {str(self.out)!r} was trained with another model config")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.total_steps = state["step"], state["total_steps"]
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state["rng"])
        segment_states = state.get("segment_states") or [None] * self.context.world_size
        if len(segment_states) != self.context.world_size:
            raise ValueError(f"--resume: the checkpoint was written by {len(segment_states)} processes; resume with as many")
        self.segment_state = _to_device(segment_states[self.context.rank], self.device)

    def save(self) -> None:
        segment_states = self.context.gather_objects(_to_device(self.segment_state, "cpu"))
        if self.context.is_main:
            save_checkpoint(self.out / CHECKPOINT_FILE, {**self.state(), "segment_states": segment_states})

    def log(self, record: dict) -> None:
        if self.context.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / "metrics.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")

    # steps ----------------------------------------------------------------------------------
    def batch(self, step: int):
        generator = step_generator(self.config.seed, step, self.context.rank)
        if self.recall:
            return self.data.batch(self.config.batch_size, generator)
        if self.config.task == "mlm":
            return mlm_batch(self.data.train, self.config.batch_size, self.config.seq_len, generator, BYTE_VOCAB)
        return lm_batch(self.data.train, self.config.batch_size, self.config.seq_len, generator)

    def train_step(self) -> float:
        torch.manual_seed(step_seed(self.config.seed, self.step, self.context.rank) + 1)  # dropout, apart from batches
        if self.streams is None:
            inputs, targets = (t.to(self.device) for t in self.batch(self.step))
            logits = self.trained(inputs)
        else:
            inputs, targets, fresh = self.streams.batch(self.step)
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            state = None if fresh else self.segment_state
            logits, self.segment_state = self.trained(inputs, state=state, return_state=True)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.item()

    def evaluate(self, split: str = "val", max_tokens: int | None = None, length: int | None = None) -> dict:
        if self.recall:
            examples = None if max_tokens is None else max(1, max_tokens // self.config.seq_len)
            return evaluate_recall(self.model, *self.data.split(split), max_examples=examples)
        data = self.data.split(split)
        length = length or self.config.seq_len
        if self.config.task == "mlm":
            return evaluate_mlm(self.model, data, length, BYTE_VOCAB, max_tokens=max_tokens, seed=self.config.seed)
        return evaluate_lm(self.model, data, length, max_tokens=max_tokens)

    def _calibrate(self, step_seconds: list[float]) -> None:
        """Fix total_steps from the time budget after the first steps (stored in checkpoints)."""
        mean = self.context.all_reduce_mean(sum(step_seconds) / len(step_seconds))
        budget = self.config.minutes * 60.0 * 0.9  # leave room for validation
        self.total_steps = max(self.step, int(budget / mean))

    def run(self) -> dict:
        config = self.config
        tokens_per_step = config.batch_size * config.seq_len * self.context.world_size
        bar = tqdm(
            total=self.total_steps, initial=self.step, disable=not (self.progress and self.context.is_main), unit="step", dynamic_ncols=True
        )
        step_seconds: list[float] = []
        started = time.perf_counter()
        while self.total_steps is None or self.step < self.total_steps:
            tick = time.perf_counter()
            loss = self.context.all_reduce_mean(self.train_step())
            elapsed = time.perf_counter() - tick
            if not math.isfinite(loss):
                raise RuntimeError(f"loss became {loss} at step {self.step}; lower --lr or raise --warmup")
            step_seconds.append(elapsed)
            if self.total_steps is None and len(step_seconds) == CALIBRATION_STEPS:
                self._calibrate(step_seconds)
                bar.total = self.total_steps
            rate = tokens_per_step / elapsed
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
            if self.step % config.eval_every == 0 or self.step == self.total_steps:
                metrics = self.evaluate("val", config.eval_tokens)
                self.log({"step": self.step, "split": "val", **metrics})
                bar.write(f"step {self.step}: val {describe(metrics)}")
                self.save()
        bar.close()
        final = self.evaluate("val")
        if step_seconds:
            seconds = sum(step_seconds) / len(step_seconds)
            final.update(seconds_per_step=seconds, train_tokens_per_s=tokens_per_step / seconds)
        self.log({"step": self.step, "split": "val", "final": True, **final})
        self.save()
        if self.context.is_main:
            save_pretrained(self.model, self.out / "model")
        self.context.barrier()
        return final

    def close(self) -> None:
        """Leave the process group. The DDP wrapper goes first, while its communicator is alive:
        gloo work it still held when freed at interpreter exit aborted a rank now and then."""
        self.trained = self.model
        self.context.close()
