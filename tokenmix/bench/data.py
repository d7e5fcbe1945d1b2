"""``tokenmix bench --kinds data``: what ``tokenmix prepare`` costs against the tokenizer alone, the share of a
training step spent drawing its batch from token shards, and the memory of training over corpora of growing size.

Records (``data_tables`` prints a table per kind):

- ``data_prepare``: ``--data-mb`` MiB of generated text (``bench.corpus``: a document per paragraph) tokenized
  by ``--tokenizer`` (``bpe:V``: learnt from the text's first MiB). By the ``tokenizers`` library alone:
  ``encode_batch`` over the documents' lines, chunk by chunk as ``prepare``'s encoder asks for them, by a
  tokenizer read from its JSON (an empty cache, as a worker's); and by ``prepare`` with 1 and 2 worker processes
  (reading, encoding, splitting and writing the text in ``PREPARE_CHUNKS`` chunks). ``tokenizers`` runs on one
  thread throughout (``one_tokenizer_thread``); ``cpu_per_wall``, the CPU seconds of this process and its
  workers per second of wall time, shows the cores in use. Each figure is the median of ``--repeats`` runs,
  the three ways taken in turn (a load that changes over minutes reaches all three), the first after a
  warm-up ``encode_batch`` of one chunk.
- ``data_step``: each model of ``--models`` at ``--model-dim``, ``--depth``, ``--lengths`` and ``--batch-tokens``
  (by default the Quickstart's TNN: width 128, depth 4, 16 sequences of 512 tokens), built by ``Trainer`` as
  ``tokenmix train`` builds it, on the same text prepared as bytes: the median time of drawing a step's
  batch (``Trainer.batch``: windows read from the shards) against the median training step (the batch,
  forward, backward, optimizer), over ``--data-steps`` steps after ``WARMUP_STEPS``.
- ``data_memory``: for each ``--data-gb`` GiB of generated text, prepared as bytes (uint16 ids) in ``--data-dir``
  (kept there for the next run; the text deleted once prepared, unless ``--keep-text``): ``tokenmix train
  --data`` of each model for ``--data-steps`` steps in a child process, evaluation reading ``EVAL_WINDOWS``
  windows at every size; and for each ``--data-processes`` count P > 1 the same run data parallel over P processes
  that torchrun starts. The peak resident memory of each training process is its own high-water mark
  (``child_peak_memory``); the record's ``peak_rss_bytes`` is the largest. Then the median time of drawing a batch
  from that corpus in this process: of a corpus larger than the page cache, mostly read from the disk.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..data.batches import random_windows
from ..data.documents import BadRecords, find_source_files
from ..data.prepare import MANIFEST, PrepareOptions, chunks_of, documents_of, prepare
from ..data.prepared import open_prepared
from ..data.tokenized import resolve_tokenizer
from ..data.tokenizer import Tokenizer, byte_tokenizer, parse_tokenizer_spec, train_bpe
from ..io.progress import progress_bar
from ..io.table import format_table
from ..train.memory import resident_peak
from .cases import batch_for
from .corpus import VERSION, corpus_files, write_corpus

DATA_KINDS = ("data_prepare", "data_step", "data_memory")
DATA = {"models": ["tnn"], "model_dim": 128, "depth": 4, "lengths": [512], "batch_tokens": 8192, "repeats": 3}  # the demo's model
THREAD_SETTINGS = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
METHODS = (("encode_batch", 1), ("prepare", 1), ("prepare", 2))  # (what tokenizes, processes)
PREPARE_CHUNKS = 16  # the --data-mb text is prepared in this many chunks, which two workers share
PARAGRAPHS = PrepareOptions(text_unit="paragraph")
MEMORY_WORKERS = min(4, os.cpu_count() or 1)  # tokenmix prepare's default
BPE_SAMPLE = 1 << 20
WARMUP_STEPS = 2
EVAL_WINDOWS = 64  # the periodic and final evaluations of a memory run: 64 windows (the demo's 32768 tokens)
DRAW_SEED = 1  # not a seed of a training step of seed 0 (``step_seed``: multiples of 97), so not the windows it read
SHARD_BYTES = 2.05  # uint16 ids of text bytes with their indexes: bytes of shards per byte of text
SPARE = 1 << 30  # free space left over after the corpora
MIB, GIB = 1 << 20, 1 << 30
SEED = 0
POLL_SECONDS = 0.05
TREE_POLLS = 20  # once all are found, the processes a child started are looked up again once a second


@contextlib.contextmanager
def one_tokenizer_thread():
    """The ``tokenizers`` library on one thread in this process and in the workers it starts: TOKENIZERS_PARALLELISM
    is read at every batch call, RAYON_NUM_THREADS when its thread pool starts; both restored after."""
    saved = {name: os.environ.get(name) for name in THREAD_SETTINGS}
    os.environ.update(THREAD_SETTINGS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def data_root(args) -> Path:
    return Path(args.data_dir).expanduser() if args.data_dir else Path(tempfile.gettempdir()) / "tokenmix-bench-data"


def corpus_folders(args, size_gb: float) -> tuple[Path, Path]:
    """(the text, its shards) of the ``size_gb`` GiB corpus in ``--data-dir``."""
    name = f"{size_gb:.12g}g-v{VERSION}"
    return data_root(args) / f"text-{name}", data_root(args) / f"tokens-{name}"


def check_data_arguments(args) -> None:
    """Refuse, before anything runs, more than one length and corpora that the disk of ``--data-dir`` has no room for."""
    if len(args.lengths) != 1:
        raise ValueError(f"--kinds data trains at one length (--lengths), got {args.lengths}")
    need, text_bytes = 4 * args.data_mb * MIB, []  # the --data-mb text with its shards, in a temporary folder
    for size in args.data_gb:
        text, tokens = corpus_folders(args, size)
        if not (tokens / MANIFEST).is_file():
            need += SHARD_BYTES * size * GIB
            text_bytes.append(0 if corpus_files(text, int(size * GIB), SEED) else size * GIB)
    need += (sum(text_bytes) if args.keep_text else max(text_bytes, default=0)) + SPARE
    folder = data_root(args)
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ValueError(
            f"--data-gb {','.join(f'{size:.12g}' for size in args.data_gb)}: the corpora need about {need / GIB:.1f} GiB free in "
            f"--data-dir {str(data_root(args))!r} (text, and 2 bytes of shards per byte of it), and {free / GIB:.1f} GiB are: "
            "give --data-dir on a disk with more room, or smaller --data-gb sizes"
        )


def data_records(args, revision: str | None, keep) -> list[dict]:
    """Every record of ``--kinds data`` (``keep(records)`` after each)."""
    settings = {"threads": args.threads, "device": args.device, "torch": torch.__version__, "git_commit": revision}
    records: list[dict] = []

    def add(record: dict) -> None:
        records.append({**record, **settings, "load_average": os.getloadavg()[0]})
        keep(records)

    with one_tokenizer_thread(), tempfile.TemporaryDirectory(prefix="tokenmix-bench-data-") as work:
        files = write_corpus(Path(work) / "text", int(args.data_mb * MIB), SEED)
        for record in prepare_records(files, args, Path(work)):
            add(record)
        prepare([str(path) for path in files], byte_tokenizer(), Path(work) / "bytes", PARAGRAPHS)
        for model in args.models:
            add(step_record(model, Path(work) / "bytes", args, Path(work) / f"run-{model}"))
    for size in args.data_gb:
        corpus = memory_corpus(size, args)
        for model in args.models:
            for processes in args.data_processes:
                add({"kind": "data_memory", "model": model, **corpus, **memory_record(model, corpus["corpus"], processes, args)})
    return records


def bench_tokenizer(spec: str, files: list[Path]) -> Tokenizer:
    """``--tokenizer``: ``bpe:V`` learnt from the first ``BPE_SAMPLE`` bytes of the text (whole lines), or as ``train`` reads it."""
    kind, vocab_size = parse_tokenizer_spec(spec)
    if kind != "bpe":
        return resolve_tokenizer(spec)
    sample = files[0].read_bytes()[:BPE_SAMPLE]
    return train_bpe(sample[: sample.rfind(b"\n") + 1], vocab_size, source="the generated text")


def timed(function, *arguments, **options) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process and of the children it waited for meanwhile, the result) of a call."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, started = time.process_time(), time.perf_counter()
    result = function(*arguments, **options)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu + (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return seconds, cpu, result


def encode_batch_seconds(tokenizer: Tokenizer, chunks: list[list[str]]) -> tuple[float, float, int]:
    """(seconds, CPU seconds, ids) of ``tokenizers``' own ``encode_batch`` over each chunk's lines, as ``ShardEncoder``
    calls it, timed call by call (counting the ids is not the library's time)."""
    from tokenizers import Tokenizer as Backend

    backend = Backend.from_str(tokenizer.to_json())
    backend.encode_special_tokens = True
    seconds = cpu = 0.0
    ids = 0
    for lines in chunks:
        wall, used, encodings = timed(backend.encode_batch, lines, add_special_tokens=False)
        seconds, cpu, ids = seconds + wall, cpu + used, ids + sum(len(encoding.ids) for encoding in encodings)
    return seconds, cpu, ids


def prepare_records(files: list[Path], args, work: Path) -> list[dict]:
    """The ``data_prepare`` records: ``tokenizers`` alone, then ``prepare`` with each worker count (module docstring)."""
    tokenizer = bench_tokenizer(args.tokenizer, files)
    options = PrepareOptions(text_unit="paragraph", chunk_mb=args.data_mb / PREPARE_CHUNKS)
    sources = [source for path in files for source in find_source_files(str(path))]
    chunks = list(chunks_of(documents_of(sources, options, BadRecords()), max(1, int(options.chunk_mb * MIB))))
    text_bytes = sum(size for _, size in chunks)
    lines = [[line for text in documents for line in text.splitlines(keepends=True)] for documents, _ in chunks]
    encode_batch_seconds(tokenizer, lines[:1])  # warm-up
    runs: dict[tuple, list[tuple[float, float, int]]] = {method: [] for method in METHODS}
    with progress_bar(total=args.repeats * len(METHODS), desc=f"data: tokenizing {text_bytes / MIB:.4g} MiB", unit="run") as bar:
        for _ in range(args.repeats):
            for method in METHODS:
                if method[0] == "encode_batch":
                    runs[method].append(encode_batch_seconds(tokenizer, lines))
                else:
                    out = work / f"prepared-{method[1]}"
                    seconds, cpu, manifest = timed(prepare, [str(path) for path in files], tokenizer, out, options, workers=method[1])
                    runs[method].append((seconds, cpu, sum(split["tokens"] for split in manifest["splits"].values())))
                    shutil.rmtree(out)
                bar.update()
    records = []
    for (method, processes), found in runs.items():
        seconds = statistics.median(run[0] for run in found)
        records.append(
            {
                "kind": "data_prepare",
                "method": method,
                "processes": processes,
                "tokenizer": tokenizer.name,
                "text_bytes": text_bytes,
                "chunks": len(chunks),
                "tokens": found[0][2],  # prepare's with each document's separator
                "repeats": args.repeats,
                "seconds": seconds,
                "seconds_runs": [run[0] for run in found],
                "mib_per_second": text_bytes / MIB / seconds,
                "cpu_per_wall": statistics.median(run[1] / run[0] for run in found),
            }
        )
    return records


def step_record(model: str, folder: Path, args, out: Path) -> dict:
    """The ``data_step`` record of ``model`` trained on the prepared ``folder`` (run directory ``out``)."""
    from ..train.config import TrainConfig
    from ..train.loop import Trainer

    length = args.lengths[0]
    batch = batch_for(length, args.batch_tokens)
    config = TrainConfig(
        model=model, task="lm", data=str(folder), dim=args.model_dim, depth=args.depth, seq_len=length, batch_size=batch,
        steps=WARMUP_STEPS + args.data_steps, threads=args.threads, device=args.device, out=str(out),
    )  # fmt: skip
    trainer = Trainer(config, progress=False)
    draws, steps = [], []
    try:
        for _ in range(WARMUP_STEPS):
            trainer.train_step()
        for _ in progress_bar(range(args.data_steps), desc=f"data: {model} steps", unit="step"):
            started = time.perf_counter()
            trainer.batch(trainer.step)  # what train_step draws first, drawn once more to be timed alone
            drawn = time.perf_counter()
            trainer.train_step()
            draws.append(drawn - started)
            steps.append(time.perf_counter() - drawn)
    finally:
        trainer.close()
    batch_ms, step_ms = statistics.median(draws) * 1e3, statistics.median(steps) * 1e3
    return {
        "kind": "data_step", "model": model, "dim": args.model_dim, "depth": args.depth, "seq_len": length, "batch": batch,
        "steps": args.data_steps, "batch_ms": batch_ms, "step_ms": step_ms, "data_share": batch_ms / step_ms,
    }  # fmt: skip


def memory_corpus(size_gb: float, args) -> dict:
    """The ``size_gb`` GiB corpus prepared as bytes in ``--data-dir`` (generated and prepared unless there already)."""
    text, tokens = corpus_folders(args, size_gb)
    found = {"text_gib": size_gb, "corpus": str(tokens), "generate_seconds": None, "prepare_seconds": None}
    if not (tokens / MANIFEST).is_file():
        found["generate_seconds"], _, files = timed(write_corpus, text, int(size_gb * GIB), SEED, progress=True)
        sources = [str(path) for path in files]
        found["prepare_seconds"], _, _ = timed(
            prepare, sources, byte_tokenizer(), tokens, PARAGRAPHS, workers=MEMORY_WORKERS, progress=True
        )
        if not args.keep_text:
            shutil.rmtree(text)
    manifest = json.loads((tokens / MANIFEST).read_text())
    found["text_bytes"] = sum(entry["bytes"] for entry in manifest["sources"])
    found["shard_bytes"] = sum(path.stat().st_size for path in tokens.iterdir() if path.suffix in (".bin", ".idx"))
    found["train_tokens"] = manifest["splits"]["train"]["tokens"]
    found["documents"] = sum(split["documents"] for split in manifest["splits"].values())
    return found


def memory_record(model: str, folder: str, processes: int, args) -> dict:
    """``tokenmix train --data folder`` of ``model`` in a child process (``processes`` > 1: started by torchrun, data
    parallel): the peak resident memory of each training process and the time; then the time of drawing batches
    from ``folder`` here."""
    length = args.lengths[0]
    batch = batch_for(length, args.batch_tokens)
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    with tempfile.TemporaryDirectory(prefix="tokenmix-bench-train-") as out:
        steps, evaluated = str(args.data_steps), str(EVAL_WINDOWS * length)
        command = [sys.executable, *launcher, "-m", "tokenmix.cli", "train", "--data", folder, "--model", model, "--task", "lm"]
        command += ["--dim", str(args.model_dim), "--depth", str(args.depth), "--seq-len", str(length), "--batch-size", str(batch)]
        command += ["--steps", steps, "--eval-every", steps, "--eval-tokens", evaluated, "--final-eval-tokens", evaluated]
        command += ["--sample-tokens", "0", "--threads", str(args.threads), "--device", args.device, "--out", str(Path(out) / "run")]
        seconds, peaks = child_peak_memory(command, Path(out) / "train.out", depth=0 if processes == 1 else 1, processes=processes)
    if len(peaks) != processes:
        raise RuntimeError(f"{shlex.join(command)}: /proc showed the resident memory of {len(peaks)} training processes, not {processes}")
    split = open_prepared(folder).train
    generator = torch.Generator().manual_seed(DRAW_SEED)
    draws = [timed(random_windows, split, batch, length, generator)[0] for _ in range(args.data_steps)]
    return {
        "processes": processes, "seq_len": length, "batch": batch, "steps": args.data_steps, "eval_tokens": EVAL_WINDOWS * length,
        "peak_rss_bytes": max(peaks.values()), "peak_rss_each": sorted(peaks.values()), "train_seconds": seconds,
        "batch_ms": statistics.median(draws) * 1e3, "batch_ms_max": max(draws) * 1e3,
    }  # fmt: skip


def process_tree(root: int) -> dict[int, int]:
    """{pid: depth} of process ``root`` (depth 0) and its descendants alive now, from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])  # the command name in parentheses may hold spaces
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    depths, level, depth = {root: 0}, [root], 0
    while level:
        depth += 1
        level = [child for pid in level for child in children.get(pid, []) if child not in depths]
        depths.update(dict.fromkeys(level, depth))
    return depths


def child_peak_memory(command: list[str], log: Path, depth: int = 0, processes: int = 1) -> tuple[float, dict[int, int]]:
    """(seconds, {pid: peak resident bytes}) of ``command`` run to its end, for its ``processes`` processes ``depth``
    levels below it (0: the command's own process; 1: those it starts, as torchrun's workers), its standard output in ``log``
    (its standard error here: progress bars and errors); RuntimeError with what it printed when it fails.

    A peak is the process's own high-water mark (``resident_peak``, read every ``POLL_SECONDS`` until it ends: the
    last moments, when it has written its model and exits, could be missed), not its ``ru_maxrss``: Linux carries
    that over an exec from the process that forked the child, so it would be at least this process's size. The
    processes are looked up in /proc at every reading until all are found, then every ``TREE_POLLS`` readings (a
    scan of every process costs more than a reading)."""
    started, peaks, watched = time.perf_counter(), {}, []
    with open(log, "wb") as output:
        child = subprocess.Popen(command, stdout=output)
    try:
        for poll in itertools.count():
            if child.poll() is not None:
                break
            if len(watched) < processes or poll % TREE_POLLS == 0:
                watched = [pid for pid, level in process_tree(child.pid).items() if level == depth]
            for pid in watched:
                found = resident_peak(pid)  # None once it has exited
                if found is not None:
                    peaks[pid] = max(found, peaks.get(pid, 0))
            time.sleep(POLL_SECONDS)
    except BaseException:
        child.kill()
        child.wait()
        raise
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with status {child.returncode}; its output ended:\n{log.read_text()[-2000:]}")
    return seconds, peaks


def data_tables(records: list[dict]) -> str:
    """Tokenizing throughput against ``tokenizers`` alone; a step's data share; peak memory against corpus size (and the
    rate its text was prepared at, as bytes, where this run prepared it)."""
    tables = []
    prepares = [r for r in records if r["kind"] == "data_prepare"]
    if prepares:
        alone = next((r["mib_per_second"] for r in prepares if r["method"] == "encode_batch"), None)
        rows = []
        for r in prepares:
            per_process = r["mib_per_second"] / r["processes"]
            rows.append(
                {
                    "method": r["method"], "tokenizer": r["tokenizer"], "processes": r["processes"], "text_MiB": r["text_bytes"] / MIB,
                    "seconds": r["seconds"], "MiB_s": r["mib_per_second"], "MiB_s_per_process": per_process,
                    "per_process_vs_encode_batch": per_process / alone if alone else None, "cpu_per_wall": r["cpu_per_wall"],
                }
            )  # fmt: skip
        tables.append(format_table(rows, list(rows[0])))
    steps = [r for r in records if r["kind"] == "data_step"]
    if steps:
        keys = ["model", "dim", "depth", "batch", "seq_len", "steps", "batch_ms", "step_ms", "data_share"]
        tables.append(format_table([{key: r[key] for key in keys} for r in steps], keys))
    memory = [r for r in records if r["kind"] == "data_memory"]
    if memory:
        smallest = {}  # the peak on the smallest corpus of each (model, processes)
        for r in sorted(memory, key=lambda r: r["text_gib"], reverse=True):
            smallest[r["model"], r.get("processes", 1)] = r["peak_rss_bytes"]  # records before --data-processes: 1
        rows = [
            {
                "model": r["model"], "processes": r.get("processes", 1), "text_GiB": r["text_bytes"] / GIB,
                "shards_GiB": r["shard_bytes"] / GIB, "train_tokens": r["train_tokens"], "steps": r["steps"],
                "peak_RSS_MiB": r["peak_rss_bytes"] / MIB,
                "least_RSS_MiB": min(r.get("peak_rss_each", [r["peak_rss_bytes"]])) / MIB,  # the smallest process's peak
                "vs_smallest": r["peak_rss_bytes"] / smallest[r["model"], r.get("processes", 1)],
                "train_s": r["train_seconds"],
                "batch_ms": r["batch_ms"], "batch_ms_max": r["batch_ms_max"],
                "prepared_MiB_s": r["text_bytes"] / MIB / r["prepare_seconds"] if r["prepare_seconds"] else None,
            }
            for r in memory
        ]  # fmt: skip
        tables.append(format_table(rows, list(rows[0])))
    return "\n\n".join(tables)
