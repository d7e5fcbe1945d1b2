"""A training run's settings: every knob of ``tokenmix train``, each checked by its field kind
(``tokenmix.fields``), with the defaults of the README demo."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..data.tokenizer import parse_tokenizer_spec
from ..devices import check_device_name
from ..fields import Choice, Existing, Integer, Names, Number, Output, Parsed, check_settings, setting
from ..models.config import POOLS, ModelConfig
from ..models.registry import list_models, resolve_model
from ..ops.fused_toeplitz import KERNELS
from ..parallel.distributed import DEFAULT_COLLECTIVE_TIMEOUT
from ..precision import PRECISIONS
from .recipes import list_recipes
from .schedule import SCHEDULES
from .sinks import SINKS

TRAIN_TASKS = ("lm", "mlm", "classify")
DEFAULT_WARMUP = 50  # steps of linear warmup when none is given: the demo's 50 of 450, so a ninth of shorter runs
TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_interval(text: str) -> tuple[int | None, float | None]:
    """``"200"`` -> every 200 steps; ``"10m"`` / ``"90s"`` / ``"2h"`` -> every so many seconds of wall time."""
    value = str(text).strip()
    unit = value[-1:] if value[-1:] in TIME_UNITS else ""
    number = value[: len(value) - len(unit)]
    try:
        amount = float(number) if unit else int(number)
    except ValueError:
        amount = None
    if amount is None or not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"save_every must be a step count (e.g. 200) or a time with unit s, m or h (e.g. 10m), got {text!r}")
    return (None, amount * TIME_UNITS[unit]) if unit else (int(amount), None)


DATA_HELP = (
    "shakespeare (embedded), a .txt file or directory, bytes:FILE (enwik8 layout), wikitext:DIR, glue-TASK:DIR, "
    "assoc-recall[:vocab=V][,pairs=K], listops[:DIR][:key=value...], shapes[:size=N], lra-text:DIR, lra-retrieval:DIR, lra-image:DIR, "
    "lra-pathfinder:DIR (docs/lra.md, docs/language.md)"
)
DATA = Parsed("a data source", str, ["/no/such/corpus.txt", "listops:no_such_option=1", "wikitext:/no/such/folder", "assoc-recall:vocab=0"])
TOKENIZER = Parsed("bytes, bpe:VOCAB or a tokenizer.json file", parse_tokenizer_spec, ["bpe:1", "bpe:x", "/no/such/tokenizer.json"])
INTERVAL = Parsed("a step count or a time (90s, 10m, 2h)", lambda text: parse_interval(text), ["soon", "0", "-5m", "10x"])
DEVICE = Parsed("auto, cpu, cuda, cuda:N or mps", check_device_name, ["tpu", "cuda:x", "cuda:-1"])
BETA = Number(0, 1, open_maximum=True)  # Adam's betas lie in [0, 1)


@dataclass
class TrainConfig:
    """Every knob of a run; the defaults are the README demo (TNN char LM on Shakespeare). Each field's
    kind checks it here and reads its ``tokenmix train`` flag (``tokenmix.fields``)."""

    model: str = setting("tnn", Choice(list_models), "model name")
    task: str = setting("lm", Choice(TRAIN_TASKS), "lm (causal language model), mlm (masked LM, bidirectional) or classify "
                        "(one label per example: ListOps, LRA, GLUE)")  # fmt: skip
    data: str = setting("shakespeare", DATA, DATA_HELP)
    dim: int = setting(128, Integer(1), "model width")
    depth: int = setting(4, Integer(1), "number of layers")
    seq_len: int = setting(512, Integer(1), "training sequence length in tokens")
    batch_size: int = setting(16, Integer(1), "sequences per step (per process)")
    steps: int | None = setting(450, Integer(1, optional=True), "optimizer steps (450 unless --minutes is given)")
    minutes: float | None = setting(
        None, Number(0, open_minimum=True, optional=True), "a time budget instead of --steps: the step count follows the run's pace"
    )
    lr: float = setting(3e-3, Number(0, open_minimum=True), "peak learning rate (AdamW)")
    min_lr_ratio: float = setting(0.1, Number(0, 1), "final learning rate of the cosine or linear schedule, as a fraction of the peak")
    warmup: int | None = setting(
        None, Integer(0, optional=True), f"linear warmup steps (default: {DEFAULT_WARMUP}, a ninth of a shorter run)"
    )  # None: ``Trainer.warmup_steps``
    schedule: str = setting(
        "cosine", Choice(SCHEDULES), "cosine or linear (to --min-lr-ratio at the last step), inverse_sqrt or constant, after the warmup"
    )
    weight_decay: float = setting(0.1, Number(0), "AdamW weight decay of weight matrices (kernel parameters are exempt)")
    beta1: float = setting(0.9, BETA, "AdamW beta1")
    beta2: float = setting(0.98, BETA, "AdamW beta2")
    grad_clip: float = setting(1.0, Number(0), "clip the gradient norm to this value (0: no clipping)")
    dropout: float = setting(0.0, Number(0, 1), "dropout probability in every block")
    seed: int = setting(0, Integer(0), "seed of the initialisation, the batches and dropout")
    threads: int | None = setting(None, Integer(1, optional=True), "torch CPU threads (default: torch's choice)")
    context_parallel: int = setting(
        1, Integer(1), "split each sequence over this many torchrun processes (context parallelism, docs/scale.md); they must divide them"
    )
    fsdp: bool = setting(
        False, None, "shard parameters, gradients and optimizer state over the torchrun processes (FSDP2); checkpoints become sharded"
    )
    activation_checkpointing: bool = setting(False, None, "recompute each block's activations in the backward pass instead of keeping them")
    precision: str = setting(
        "fp32",
        Choice(list(PRECISIONS)),
        "compute dtype of the forward passes (autocast); parameters and optimizer state stay fp32, FFT products run in fp32, "
        "fp16 scales the loss (docs/training.md)",
    )
    compile: bool = setting(False, None, "torch.compile each block, forward and backward (docs/training.md); the first steps compile")
    kernels: str = setting(
        "auto",
        Choice(list(KERNELS)),
        "the Toeplitz mixers' fused Triton kernels (tno, fd_tno, causal ski_tno): auto (on CUDA where triton imports and they "
        "passed their probe, else PyTorch's), torch (PyTorch's path) or fused (docs/training.md)",
    )
    collective_timeout: float = setting(
        DEFAULT_COLLECTIVE_TIMEOUT,
        Number(0, open_minimum=True),
        "torchrun: seconds a process waits for the others at a collective before it stops, naming its rank and what it waited for",
    )
    eval_every: int = setting(150, Integer(1), "validate every this many steps, on --eval-tokens tokens")
    eval_tokens: int = setting(32768, Integer(1), "validation tokens of each periodic evaluation")
    final_eval_tokens: int | None = setting(
        None, Integer(1, optional=True), "validation tokens of the final evaluation (default: the whole split)"
    )
    save_every: str = setting(
        "5m", INTERVAL, "write checkpoint.pt every N steps (e.g. 200) or every time T (e.g. 10m, 90s); also at the end and on Ctrl-C"
    )
    log: list | None = setting(
        None,
        Names(("none", *SINKS), optional=True),
        "also send the metrics to these trackers, e.g. tensorboard,wandb (docs/training.md#trackers); none: to none (at a resume)",
    )
    check_finite: bool = setting(False, None, "debug: every mixer refuses NaN/Inf inputs, which an FFT would spread to earlier positions")
    device: str = setting("auto", DEVICE, "auto (CUDA when available), cpu, cuda or cuda:N")
    out: str = setting("runs/demo", Output("a folder for the run", folder=True), "run directory: checkpoint.pt, metrics.jsonl, model/")
    pool: str = setting("mean", Choice(POOLS), "classification: mean of the real tokens' final states, or first or last (that token's)")
    tokenizer: str = setting("bytes", TOKENIZER, "text: bytes, bpe:VOCAB (a byte-level BPE learnt from the training split) or a "
                             "tokenizer.json file")  # fmt: skip
    init: str | None = setting(
        None, Existing("a pretrained run", optional=True), "start from the weights of this pretrained run (`tokenmix finetune` sets it)"
    )
    recipe: str | None = setting(
        None,
        Choice(list_recipes, optional=True, listed=False),
        "a named preset (`tokenmix recipes` lists them); flags beside it override its values",
    )
    options: dict = setting(None, None, "model and mixer options", factory=dict)

    def __post_init__(self):
        check_settings(self)
        if self.pool != "mean" and self.task != "classify":
            raise ValueError(f"pool shapes a classifier's head: use it with task 'classify', not {self.task!r}")
        if (self.steps is None) == (self.minutes is None):
            raise ValueError("give exactly one of steps and minutes (a time budget)")
        if self.warmup is not None and self.steps is not None and 0 < self.steps <= self.warmup:
            raise ValueError(
                f"warmup ({self.warmup}) must be below steps ({self.steps}): the learning rate would still be rising at the "
                f"last step and never reach lr. Give a shorter warmup, or leave it out (default: {DEFAULT_WARMUP} steps, "
                "a ninth of a shorter run)"
            )
        if self.seq_len < self.context_parallel:
            raise ValueError(f"seq_len={self.seq_len} gives fewer tokens than the {self.context_parallel} processes that would share them")
        if self.precision == "fp16" and self.fsdp:
            raise ValueError(
                "precision 'fp16' with --fsdp: fp16 needs a loss scaler whose overflow check agrees over the shards, which "
                "tokenmix does not have for FSDP2; use --precision bf16 (no loss scaling needed) or train without --fsdp"
            )
        if self.compile and self.context_parallel > 1:
            raise ValueError(
                "--compile with --context-parallel: the exchanges between processes run inside the blocks, which a compiled "
                "block cannot hold; train without --compile, or without --context-parallel"
            )
        if self.log is not None and "none" in self.log:
            if len(self.log) > 1:
                raise ValueError(f"--log none (no tracker) goes alone, got {','.join(self.log)}")
            self.log = None
        if not isinstance(self.options, dict):
            raise ValueError(f"options must be a dict of model options, got {type(self.options).__name__}")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(repr, set(data) - known))
        if unknown:
            raise ValueError(f"train config has unknown keys {', '.join(unknown)} (written by a newer tokenmix?)")
        return cls(**data)

    def model_config(self, data_fields: dict) -> ModelConfig:
        """The model for the data's ``data_fields`` (``Objective.model_fields``: vocabulary, and for
        classification classes, documents and the image grid, which reaches mixers that take one);
        segment-recurrent (XL) models get segments of ``seq_len``, the way they are trained."""
        fields = dict(data_fields)
        grid = fields.pop("grid", None)
        fallbacks = {"segment_length": self.seq_len, **({} if grid is None else {"grid": list(grid)})}
        options = resolve_model(self.model, {"dropout": self.dropout, **self.options}, self.dim, self.depth, fallbacks)
        pool = {"pool": self.pool} if self.task == "classify" else {}
        return ModelConfig(self.model, self.task, dim=self.dim, depth=self.depth, options=options, **pool, **fields)
