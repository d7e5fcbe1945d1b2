"""What a run reads and builds before its first step, in the order ``Trainer`` needs them: the process's
settings, the pretrained model a fine-tuning run starts from, the tokenizer, the data, the model, the
run directory (touched last, once every setting is checked), and the trackers the metrics also go to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..data.provenance import record_reads
from ..data.sources import DataSource, load_data
from ..data.tokenizer import TOKENIZER_FILE
from ..devices import resolve_device
from ..models.model import SequenceModel
from ..ops.fused_toeplitz import check_fused_device
from ..parallel import context_parallel_problems
from ..parallel.dims import ParallelDims, init_distributed
from ..parallel.distributed import check_launch
from ..runs import Run, open_run
from ..runs.checkpoint import check_tokenizer_beside, checkpoint_tokenizer, model_config_of
from ..runs.layout import CHECKPOINT_FILE, METRICS_FILE
from ..runs.sharded import SHARDS_KEY
from ..runtime import set_threads
from ..validation import set_finite_checks
from .checkpointing import check_resume, check_world_size
from .config import TrainConfig
from .directory import check_directory, claim_directory, clean_stale, truncate_metrics
from .finetune import check_init_task, load_initial_weights
from .objectives import Objective, check_task, objective_for
from .sinks import LogSinks, check_installed


def configure_process(config: TrainConfig) -> torch.device:
    """This process set up for the run (threads, finite checks); its device. ValueError, before any data is
    read, for a task the data cannot learn, a launch the run's parallelism does not fit, or a tracker (``--log``)
    whose library is missing."""
    if config.threads:
        set_threads(config.threads)
    if config.check_finite:
        set_finite_checks(True)
    device = resolve_device(config.device)
    if config.kernels == "fused":
        try:
            check_fused_device(device)
        except ValueError as error:
            raise ValueError(f"kernels 'fused' (--kernels; a resume keeps the run's own unless --kernels gives another): {error}") from None
    check_task(config.data, config.task)  # before the data is read or generated
    check_launch(config.context_parallel, config.fsdp)
    check_installed(config.log or ())
    return device


def initial_pretrained(config: TrainConfig, resume: bool, pretrained: Run | None) -> Run | None:
    """The pretrained model ``config.init`` names, which a new fine-tuning run starts from (``pretrained``: when
    already read, by ``tokenmix finetune``); None for other runs."""
    if config.init is None or resume:
        return None
    pretrained = pretrained or open_run(config.init)
    check_init_task(pretrained, config.init, config.task)
    return pretrained


def run_tokenizer(config: TrainConfig, saved: dict | None, pretrained: Run | None):
    """The tokenizer (or its spec) the run reads its data with: a resumed run's, kept in its checkpoint ``saved``;
    a fine-tuning run's pretrained model's; else ``config.tokenizer``."""
    if saved:
        path = Path(config.out) / CHECKPOINT_FILE
        kept = checkpoint_tokenizer(saved, path)
        check_tokenizer_beside(path, kept)
        return kept or config.tokenizer
    return pretrained.tokenizer if pretrained else config.tokenizer


def initial_vocab(config: TrainConfig, saved: dict | None, pretrained: Run | None) -> int | None:
    """The embedding rows a fine-tuned model keeps from its pretrained one (and a resumed one from itself)."""
    if saved:
        return model_config_of(saved, Path(config.out) / CHECKPOINT_FILE).vocab_size
    return pretrained and pretrained.config.vocab_size


def read_data(config: TrainConfig, tokenizer, progress: bool) -> tuple[DataSource, dict]:
    """(data, the fingerprints of the files it was read from: kept in checkpoints, so a resume on changed files
    is refused). Fails before any training on a bad path; a BPE is learnt (or read from the cache) here."""
    with record_reads() as reads:
        data = load_data(config.data, config.seq_len, config.seed, tokenizer, progress=progress)
    return data, reads.fingerprints()


@dataclass
class RunData:
    """What a run reads before it builds its model."""

    config: TrainConfig  # the tokenizer a fine-tuning run takes from its model, the options a resume spells as the run did
    data: DataSource
    data_files: dict  # the fingerprints of the files read
    objective: Objective
    model_fields: dict  # what the data fixes of the model; a fine-tuned model keeps its pretrained embedding rows
    pretrained: Run | None


def read_run_data(config: TrainConfig, saved: dict | None, pretrained: Run | None, allow_data_change: bool, progress: bool) -> RunData:
    """The run's data, read with the tokenizer a resumed run was trained with (kept in its checkpoint ``saved``,
    whose settings are then checked against ``config``: ``check_resume``) or a fine-tuning run's pretrained model's."""
    pretrained = initial_pretrained(config, saved is not None, pretrained)
    tokenizer = run_tokenizer(config, saved, pretrained)
    if pretrained:
        config = replace(config, tokenizer=tokenizer.name)
    vocab = initial_vocab(config, saved, pretrained)
    data, data_files = read_data(config, tokenizer, progress)
    objective = objective_for(data, config.task, config.seed)
    model_fields = objective.model_fields()
    if vocab:
        model_fields["vocab_size"] = max(model_fields["vocab_size"], vocab)
    if saved is not None:
        config = check_resume(saved, config, model_fields, data_files, allow_data_change)
    return RunData(config, data, data_files, objective, model_fields, pretrained)


def build_model(
    config: TrainConfig, checkpoint: dict | None, model_fields: dict, pretrained: Run | None, objective: Objective
) -> SequenceModel:
    """The run's model, initialised from ``config.seed`` (and ``pretrained``'s weights); a resumed model is rebuilt
    from its ``checkpoint``'s resolved config, so defaults that changed since do not touch it. ValueError for a
    model the data or ``--context-parallel`` cannot train."""
    model_config = (
        model_config_of(checkpoint, Path(config.out) / CHECKPOINT_FILE) if checkpoint is not None else config.model_config(model_fields)
    )
    torch.manual_seed(config.seed)
    model = SequenceModel(model_config)
    if pretrained is not None:
        load_initial_weights(model, pretrained, config.init)
    if model.recurrent and not objective.streams:
        raise ValueError(f"data {config.data!r} needs a model that reads whole examples, not the segment-recurrent {config.model!r}")
    if model.recurrent and getattr(objective.data, "windows", "across") == "within":
        raise ValueError(f"data {config.data!r}: windows=within does not apply to the segment-recurrent {config.model!r}")
    problems = context_parallel_problems(model, config.context_parallel) if config.context_parallel > 1 else []
    if problems:
        raise ValueError(f"--context-parallel {config.context_parallel}: " + "; ".join(problems))
    return model


def join_processes(config: TrainConfig, device: torch.device, saved: dict | None, overwrite: bool) -> ParallelDims:
    """The processes torchrun started, joined (``init_distributed``) once the run directory is known to be free
    (a new run, on every rank, before any of them waits for the others) or the checkpoint ``saved`` to resume on them."""
    if saved is None:
        check_directory(Path(config.out), overwrite)
    dims = init_distributed(device, config.context_parallel, config.collective_timeout)
    if saved is not None:
        check_world_size(saved, dims.world_size, Path(config.out) / CHECKPOINT_FILE)
    return dims


def prepare_directory(out: Path, checkpoint: dict | None, overwrite: bool, tokenizer) -> list[Path]:
    """The run directory made ready (main process): a resumed run's files of steps past its ``checkpoint``
    removed, a new run's claimed (``overwrite``: replacing a run there) with its ``tokenizer`` saved. Returns
    the stale files removed (a save interrupted by a kill)."""
    if checkpoint is not None:
        removed = clean_stale(out, checkpoint.get(SHARDS_KEY))
        truncate_metrics(out / METRICS_FILE, checkpoint["step"])
        return removed
    removed = claim_directory(out, overwrite)
    if tokenizer is not None:
        tokenizer.save(out / TOKENIZER_FILE)
    return removed


def start_trackers(config: TrainConfig, model: SequenceModel, out: Path, checkpoint: dict | None, is_main: bool) -> LogSinks:
    """The trackers of ``--log`` (``sinks.py``) for the run in ``out``, going on from its ``checkpoint`` (None: a new
    run), with its resolved settings; started by the main process alone, which alone writes ``metrics.jsonl``."""
    if not (is_main and config.log):
        return LogSinks()
    settings = {"train": asdict(config), "model": model.config.to_dict()}
    return LogSinks.open(config.log, out, settings, checkpoint["step"] if checkpoint else 0)
