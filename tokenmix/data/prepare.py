"""``tokenmix prepare``: a corpus as token shards on disk, which training reads without holding it in memory.

The folder (``docs/data.md`` spells the format out for readers outside tokenmix; numpy's ``memmap`` reads it):

    manifest.json        what the shards hold; written last, so a folder without it is unfinished
    tokenizer.json       the tokenizer the ids are of
    {split}-NNNNN.bin    token ids of chunk NNNNN's documents of that split, little-endian uint16 or uint32
    {split}-NNNNN.idx    int64 offsets: document i is ids [idx[i], idx[i + 1]) of the .bin, its separator last

The sources' documents are read in order and cut into chunks of about ``chunk_mb`` of text; each document
goes to the split its hash gives (``shard_encoder.document_split``), so the splits are the same whichever
chunk size or process count prepared them. Worker processes encode the chunks; this process writes them, in
order, each file atomically, and notes each finished chunk in ``chunks.jsonl`` beside the plan
(``prepare.json``: sources with their sizes and digests, the tokenizer, the options). Run again, prepare
checks the plan and continues after the last finished chunk; the two work files go once the manifest is written.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..io.files import append_line, write_bytes_atomic, write_json_atomic
from ..io.progress import progress_bar
from .documents import BadRecords, SourceFile, file_digest, find_source_files, hub_documents, read_documents
from .shard_encoder import SPLITS, ChunkTokens, ShardEncoder, document_split, encode_in_worker, start_worker, token_dtype
from .tokenized import resolve_tokenizer
from .tokenizer import TOKENIZER_FILE, Tokenizer, parse_tokenizer_spec

FORMAT, VERSION = "tokenmix-tokens", 1
MANIFEST, PLAN, FINISHED = "manifest.json", "prepare.json", "chunks.jsonl"
HUB_PREFIX = "hf:"
NEWLINE = 10  # the separator of a byte tokenizer's documents (a BPE's is its end-of-document token)


@dataclass(frozen=True)
class PrepareOptions:
    """How sources become documents and documents splits (kept in the manifest: changing one is another dataset)."""

    field: str = "text"  # jsonl, parquet and datasets: the column of the text
    text_unit: str = "file"  # text files: one document per file, paragraph or line
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    chunk_mb: float = 64.0  # text per chunk, in MiB

    def __post_init__(self):
        from .documents import TEXT_UNITS

        if self.text_unit not in TEXT_UNITS:
            raise ValueError(f"--text-unit must be one of {list(TEXT_UNITS)}, got {self.text_unit!r}")
        for flag, value in (("--val-fraction", self.val_fraction), ("--test-fraction", self.test_fraction)):
            if not 0 <= value < 1:
                raise ValueError(f"{flag} must be in [0, 1), got {value}")
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"--val-fraction + --test-fraction must leave the train split documents, got {self.val_fraction + self.test_fraction}"
            )
        if not self.chunk_mb > 0:
            raise ValueError(f"--chunk-mb must be positive, got {self.chunk_mb}")
        if not self.field:
            raise ValueError("--field must name a column, got ''")


def separator_of(tokenizer: Tokenizer) -> int:
    return NEWLINE if tokenizer.end_of_document_id is None else tokenizer.end_of_document_id


def describe_sources(sources: list[str]) -> tuple[list[SourceFile | str], list[dict]]:
    """(each source file, or ``hf:`` spec, in reading order; their manifest entries: name, bytes, sha256)."""
    found, entries = [], []
    for source in sources:
        if source.startswith(HUB_PREFIX):
            found.append(source)
            entries.append({"name": source})
            continue
        for file in find_source_files(source):
            found.append(file)
            entries.append({"name": file.name, "bytes": file.path.stat().st_size, "sha256": file_digest(file.path)})
    return found, entries


def documents_of(sources: list[SourceFile | str], options: PrepareOptions, bad: BadRecords) -> Iterator[str]:
    for source in sources:
        if isinstance(source, str):
            yield from hub_documents(source, field=options.field, bad=bad)
        else:
            yield from read_documents(source, field=options.field, text_unit=options.text_unit, bad=bad)


def chunks_of(documents: Iterator[str], chunk_bytes: int) -> Iterator[tuple[list[str], int]]:
    """(documents, their UTF-8 bytes) in order, each group closed once it holds ``chunk_bytes``."""
    group, size = [], 0
    for text in documents:
        group.append(text)
        size += len(text.encode())
        if size >= chunk_bytes:
            yield group, size
            group, size = [], 0
    if group:
        yield group, size


def shard_name(split: str, chunk: int) -> str:
    return f"{split}-{chunk:05d}"


def write_chunk(out: Path, index: int, encoded: dict[str, ChunkTokens]) -> dict:
    """The chunk's files (each atomically) and its record: for each split its ids and documents."""
    record = {"chunk": index}
    for split, part in encoded.items():
        name = shard_name(split, index)
        write_bytes_atomic(out / f"{name}.bin", part.tokens.tobytes())
        write_bytes_atomic(out / f"{name}.idx", part.offsets.astype("<i8").tobytes())
        record[split] = {"tokens": int(len(part.tokens)), "documents": int(len(part.offsets) - 1)}
    return record


def finished_chunks(path: Path) -> dict[int, dict]:
    """The chunk records an earlier run noted (a last line cut short by a kill is ignored: that chunk is redone)."""
    records = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[record["chunk"]] = record
    return records


def check_plan(out: Path, plan: dict) -> None:
    """Refuse a folder that holds another dataset, or the start of one prepared from other inputs."""
    for name in (MANIFEST, PLAN):
        path = out / name
        if not path.is_file():
            continue
        try:
            earlier = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--out {str(out)!r}: {name} is unreadable ({error}); remove the folder to prepare again") from None
        differences = plan_differences({key: earlier.get(key) for key in plan}, plan)
        if differences:
            raise ValueError(
                f"--out {str(out)!r} holds a dataset prepared from other inputs ({'; '.join(differences)}): give another --out"
            )
        return
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r} is a folder that holds other files; prepare writes into an empty or new folder")


def plan_differences(earlier: dict, now: dict) -> list[str]:
    """What changed between two plans: each changed source file by name, else each changed key."""
    changes = []
    before = {entry["name"]: entry for entry in earlier.get("sources") or []}
    for entry in now["sources"]:
        old = before.pop(entry["name"], None)
        if old is None:
            changes.append(f"{entry['name']} is new")
        elif old.get("bytes") != entry.get("bytes"):
            changes.append(f"{entry['name']} changed since ({old.get('bytes')} bytes then, {entry.get('bytes')} now)")
        elif old != entry:
            changes.append(f"{entry['name']} changed since (same size, other content)")
    changes += [f"{name} is gone" for name in before]
    changes += [f"its {key} differs" for key in now if key != "sources" and earlier.get(key) != now[key]]
    return changes


def encoded_chunks(chunks: Iterator[tuple[list[str], int]], skip: set[int], encoder_arguments: tuple, workers: int):
    """(index, bytes, encoded or None for a chunk in ``skip``) in order; ``workers`` > 1 encodes in that many
    processes, at most two chunks each ahead of the writer."""
    if workers == 1:
        encoder = ShardEncoder(*encoder_arguments)
        for index, (documents, size) in enumerate(chunks):
            yield index, size, None if index in skip else encoder(documents)
        return
    # Forked, a worker starts at once and imports nothing (spawned, it would import this command, torch with it: ~3 s
    # and ~0.5 GB each). This process runs no torch operator and holds no lock a worker takes; the tokenizers
    # library's thread pool, which a BPE learnt here started, is off in the workers (one thread each, as measured).
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=start_worker, initargs=(os.getpid(), *encoder_arguments)
    ) as pool:
        pending = collections.deque()
        for index, (documents, size) in enumerate(chunks):
            pending.append((index, size, None if index in skip else pool.submit(encode_in_worker, documents)))
            while len(pending) > 2 * workers:
                index_done, size_done, future = pending.popleft()
                yield index_done, size_done, future and future.result()
        while pending:
            index_done, size_done, future = pending.popleft()
            yield index_done, size_done, future and future.result()


def kept_spec(out: Path) -> str | None:
    """The ``--tokenizer`` a prepared or begun folder was prepared with (None: no such folder)."""
    for name in (MANIFEST, PLAN):
        if (out / name).is_file() and (out / TOKENIZER_FILE).is_file():
            try:
                return json.loads((out / name).read_text())["tokenizer"]["spec"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def tokenizer_for(spec: str, sources: list[str], options: PrepareOptions, sample_bytes: int, out, progress: bool = False) -> Tokenizer:
    """``--tokenizer``: bytes, a tokenizer.json, or bpe:V learnt from the first ``sample_bytes`` of the training
    documents (through the cache of learnt BPEs). A folder prepared, or begun, with the same bpe:V keeps the one it
    learnt."""
    kind, _ = parse_tokenizer_spec(spec)
    if kind == "bpe" and kept_spec(Path(out)) == spec:
        return Tokenizer.load(Path(out) / TOKENIZER_FILE)
    if kind != "bpe":
        return resolve_tokenizer(spec)
    sample, size = [], 0
    for text in documents_of(describe_sources(sources)[0], options, BadRecords(skip=True)):
        if document_split(text, options.val_fraction, options.test_fraction) == "train":
            sample.append(text.encode())
            size += len(sample[-1]) + 1
            if size >= sample_bytes:
                break
    return resolve_tokenizer(spec, b"\n".join(sample), progress, f"the first {size:,} bytes of the training documents")


def prepare(
    sources: list[str], tokenizer: Tokenizer, out, options: PrepareOptions = PrepareOptions(), *, workers: int = 1, skip_bad: bool = False,
    progress: bool = False, tokenizer_spec: str | None = None,
) -> dict:  # fmt: skip
    """Prepare ``sources`` into ``out`` (see the module docstring) and return the manifest; an unfinished
    ``out`` of the same inputs is continued, a finished one returned as it is. ``tokenizer_spec``: what
    ``--tokenizer`` said (bpe:V), kept so that a second run asking the same reads the BPE learnt the first time."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    out = Path(out)
    found, entries = describe_sources(sources)
    dtype = token_dtype(tokenizer.vocab_size)
    plan = {
        "format": FORMAT,
        "version": VERSION,
        "sources": entries,
        "tokenizer": {
            "spec": tokenizer_spec or tokenizer.name,
            "name": tokenizer.name,
            "fingerprint": tokenizer.fingerprint,
            "vocab_size": tokenizer.vocab_size,
        },
        "separator": separator_of(tokenizer),
        "dtype": dtype.name,
        "options": asdict(options),
    }
    check_plan(out, plan)
    if (out / MANIFEST).is_file():
        return json.loads((out / MANIFEST).read_text())
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out / TOKENIZER_FILE)
    write_json_atomic(out / PLAN, plan)
    done = finished_chunks(out / FINISHED)
    bad = BadRecords(skip=skip_bad)
    plain = all(isinstance(source, SourceFile) and source.format in ("text", "jsonl") and source.compression is None for source in found)
    tokenizer_json = None if tokenizer.is_bytes else tokenizer.to_json()
    arguments = (tokenizer_json, plan["separator"], dtype.str, options.val_fraction, options.test_fraction)
    chunks = chunks_of(documents_of(found, options, bad), max(1, int(options.chunk_mb * (1 << 20))))
    records = []
    total = sum(entry["bytes"] for entry in entries) if plain else None
    with progress_bar(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress) as bar:
        for index, size, encoded in encoded_chunks(chunks, set(done), arguments, workers):
            if encoded is None:
                records.append(done[index])
            else:
                records.append(write_chunk(out, index, encoded))
                append_line(out / FINISHED, json.dumps(records[-1]))
            bar.update(size)
    manifest = {**plan, "chunks": records, "splits": split_totals(records), "skipped_records": bad.count}
    write_json_atomic(out / MANIFEST, manifest)
    for name in (PLAN, FINISHED):
        (out / name).unlink(missing_ok=True)
    return manifest


def split_totals(records: list[dict]) -> dict:
    """{split: {"tokens", "documents"}} over the chunk records."""
    return {
        split: {key: sum(record[split][key] for record in records if split in record) for key in ("tokens", "documents")}
        for split in SPLITS
    }


def summary(manifest: dict) -> str:
    """One line per split: its documents and tokens."""
    lines = []
    for split in SPLITS:
        totals = manifest["splits"][split]
        lines.append(f"{split}: {totals['documents']:,} documents, {totals['tokens']:,} tokens")
    if manifest.get("skipped_records"):
        lines.append(f"skipped {manifest['skipped_records']:,} bad records (--skip-bad)")
    return "\n".join(lines)
