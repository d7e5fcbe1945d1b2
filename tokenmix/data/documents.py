"""The documents of a corpus in the formats researchers keep them in (what ``tokenmix prepare`` reads).

A SOURCE is a file, a folder searched recursively, a folder written by ``datasets``'
``save_to_disk``, or ``hf:NAME[:config=CONFIG][:split=SPLIT]``, a dataset loaded by ``datasets``.
Formats by suffix: ``.txt .text .md`` (text), ``.jsonl .json`` (JSON Lines: one object per line;
a document is its ``field``), ``.parquet``, ``.arrow`` (a string column ``field``); text and JSON
Lines may be compressed (``.gz``, ``.zst``, ``.zstd``). Files are streamed: a text file is held whole
only when one document is the whole file.

A bad record (invalid UTF-8, a line that is not a JSON object with a string ``field``, a null value)
raises a ValueError naming its place (``data/a.jsonl:17``, ``b.parquet:row 3``), or is counted and
skipped by a ``BadRecords(skip=True)``. A problem of the whole file (unreadable, corrupt compressed
data, a missing or non-string column) always raises. Readers of parquet, arrow, zstd and the hub need
the optional extra ``pip install "tokenmix[prepare]"`` (pyarrow, zstandard, datasets), imported only
when used.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .provenance import note_read

TEXT_UNITS = ("file", "paragraph", "line")  # what one document of a text file is
FORMATS = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
COMPRESSIBLE = ("text", "jsonl")
READ = ".txt .text .md .jsonl .json (each also .gz .zst .zstd), .parquet, .arrow"
HUB_PREFIX = "hf:"
HUB_OPTIONS = ("config", "split")
EXTRA = 'pip install "tokenmix[prepare]"'
DATASET_DICT, DATASET_STATE = "dataset_dict.json", "state.json"  # the files `save_to_disk` writes
BLOCK = 1 << 20
BATCH_ROWS = 1024
BOM = b"\xef\xbb\xbf"
ZSTD_MAX_WINDOW = 1 << 31  # frames written with `zstd --long` (up to 2 GiB windows) decompress too
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


@dataclass(frozen=True)
class SourceFile:
    path: Path  # absolute
    name: str  # path relative to the SOURCE given (its file name when SOURCE is a file): what manifests and errors show
    format: str  # "text" | "jsonl" | "parquet" | "arrow"
    compression: str | None  # None | "gzip" | "zstd"


class BadRecords:
    """Counts bad records; ``skip=False`` (default) raises on the first one. ``examples`` keeps the first few messages."""

    KEPT = 5

    def __init__(self, skip: bool = False):
        self.skip = skip
        self.count = 0
        self.examples: list[str] = []

    def __call__(self, where: str, what: str) -> None:
        """A bad record at ``where`` (``data/a.jsonl:17``): ValueError ``where: what`` unless skipping, else counted."""
        message = f"{where}: {what}"
        if not self.skip:
            raise ValueError(message)
        self.count += 1
        if len(self.examples) < self.KEPT:
            self.examples.append(message)


def _need(module: str, purpose: str):
    """``module``, imported; a one-line ValueError naming the extra when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{purpose} needs {module.partition('.')[0]}: {EXTRA}") from None


def _kind(name: str) -> tuple[str, str | None] | None:
    """(format, compression) of a file name by its suffixes, None when it is not read."""
    stem, _, last = name.lower().rpartition(".")
    if not stem:
        return None
    compression = COMPRESSIONS.get("." + last)
    if compression is None:
        return (FORMATS["." + last], None) if "." + last in FORMATS else None
    inner_stem, _, inner = stem.rpartition(".")
    form = FORMATS.get("." + inner)
    return (form, compression) if inner_stem and form in COMPRESSIBLE else None


def find_source_files(source: str) -> list[SourceFile]:
    """The files SOURCE names, in reading order.

    SOURCE is a file, or a folder searched recursively (sorted by relative path, folder by folder;
    hidden files and folders, symbolic links to folders and files of other suffixes are ignored), or a
    folder saved by ``datasets`` (``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, known by
    its ``state.json`` / ``dataset_dict.json``, here or anywhere below a searched folder): its arrow
    files in the dataset's own order, every split of a DatasetDict in its listed order. ValueError
    naming SOURCE when it does not exist, holds no file that is read, or is a file of another suffix.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise ValueError(f"source {source!r} does not exist")
    if not path.is_dir():
        kind = _kind(path.name)
        if kind is None:
            raise ValueError(f"source {source!r}: unknown suffix; files read: {READ}")
        return [SourceFile(path.absolute(), path.name, *kind)]
    files = _folder_files(path.absolute(), path.absolute())
    if not files:
        raise ValueError(f"source {source!r} holds no file that is read; files read: {READ}")
    return files


def _folder_files(folder: Path, root: Path) -> list[SourceFile]:
    if (folder / DATASET_DICT).is_file() or (folder / DATASET_STATE).is_file():
        return _saved_dataset_files(folder, root)
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as error:
        raise ValueError(f"folder {str(folder)!r} is unreadable: {error.strerror}") from None
    files = []
    for entry in entries:
        path = Path(entry.path)
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            files += _folder_files(path, root)
        elif entry.is_file() and (kind := _kind(entry.name)) is not None:
            files.append(SourceFile(path, path.relative_to(root).as_posix(), *kind))
    return files


def _saved_dataset_files(folder: Path, root: Path) -> list[SourceFile]:
    """The arrow files of a ``save_to_disk`` folder: a DatasetDict's splits in order, a Dataset's ``_data_files`` in order."""
    if (folder / DATASET_DICT).is_file():
        splits = _saved_json(folder / DATASET_DICT, root).get("splits")
        if not isinstance(splits, list) or not all(isinstance(split, str) and split and Path(split).name == split for split in splits):
            raise ValueError(f"{(folder / DATASET_DICT).relative_to(root).as_posix()}: 'splits' is not a list of folder names")
        for split in splits:
            if not (folder / split / DATASET_STATE).is_file():
                raise ValueError(f"{(folder / split).relative_to(root).as_posix()}: split folder without {DATASET_STATE}")
        return [file for split in splits for file in _saved_dataset_files(folder / split, root)]
    state = folder / DATASET_STATE
    entries = _saved_json(state, root).get("_data_files")
    names = [entry.get("filename") for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else None
    if not names or not all(isinstance(name, str) and Path(name).name == name and name.endswith(".arrow") for name in names):
        raise ValueError(f"{state.relative_to(root).as_posix()}: '_data_files' is not a list of arrow file names")
    files = [SourceFile(folder / name, (folder / name).relative_to(root).as_posix(), "arrow", None) for name in names]
    for file in files:
        if not file.path.is_file():
            raise ValueError(f"{file.name} is missing; {state.relative_to(root).as_posix()} lists it")
    return files


def _saved_json(path: Path, root: Path) -> dict:
    name = path.relative_to(root).as_posix()
    try:
        data = json.loads(path.read_bytes())
    except OSError as error:
        raise ValueError(f"{name} is unreadable: {error.strerror}") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{name} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name} is not a JSON object")
    return data


def read_documents(file: SourceFile, *, field: str = "text", text_unit: str = "file", bad: BadRecords | None = None) -> Iterator[str]:
    """The documents of one file, in order.

    text: the whole file (``text_unit="file"``), or its paragraphs (split at blank lines: one or more
    lines that are empty or whitespace only; a paragraph is its lines exactly, without the line break
    that ends its last line), or its lines that are not blank (without their ``\\n`` or ``\\r\\n``).
    Lines end at ``\\n`` only. No unit yields a blank document (an empty file yields none). A UTF-8
    byte order mark opening a text or JSON Lines file is dropped. Invalid UTF-8 is a bad record
    ``FILE:LINE`` (the whole file, the paragraph or the line holding it).
    jsonl: each line that is not blank holds a JSON object whose ``field`` is a string; any other
    line is a bad record ``FILE:LINE``.
    parquet / arrow: column ``field`` must exist and hold strings (else ValueError naming the file, the
    field and its columns); a null is a bad record ``FILE:row N`` (rows counted from 0). Parquet is read
    by record batches row group after row group, arrow files (IPC file or stream format, which
    ``datasets`` writes) by record batch through a memory map.
    """
    if text_unit not in TEXT_UNITS:
        raise ValueError(f"text_unit must be one of {list(TEXT_UNITS)}, got {text_unit!r}")
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must be a non-empty column or key name, got {field!r}")
    bad = BadRecords() if bad is None else bad
    note_read(file.path)
    if file.format == "text":
        return _text_documents(file, text_unit, bad)
    if file.format == "jsonl":
        return _jsonl_documents(file, field, bad)
    if file.format in ("parquet", "arrow"):
        return _column_documents(file, field, bad)
    raise ValueError(f"{file.name}: format must be one of text, jsonl, parquet, arrow, got {file.format!r}")


class _ZstdStream(io.RawIOBase):
    """The decompressed bytes of a zstd file of one or more frames. A file cut inside a frame is an
    EOFError (the stream readers of ``zstandard`` end there silently)."""

    def __init__(self, path: Path, zstandard):
        super().__init__()
        self._file = open(path, "rb")
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        self._frame = None  # the decompressor of the frame being read; None between frames
        self._input = b""
        self._output, self._offset = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while self._offset == len(self._output):
            if not self._input:
                self._input = self._file.read(BLOCK)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("compressed file ended before the end of its last frame")
                    return 0
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            self._output, self._offset = self._frame.decompress(self._input), 0
            self._input = b""
            if self._frame.eof:
                self._input, self._frame = self._frame.unused_data, None
        count = min(len(target), len(self._output) - self._offset)
        target[:count] = self._output[self._offset : self._offset + count]
        self._offset += count
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


@contextlib.contextmanager
def _decompressed(file: SourceFile) -> Iterator[tuple[io.BufferedIOBase, tuple]]:
    """A binary stream of the file's (decompressed) bytes and the errors its reading may raise."""
    errors: tuple = (OSError, EOFError)
    try:
        if file.compression == "zstd":
            zstandard = _need("zstandard", f"{file.name}: reading zstd files")
            errors += (zstandard.ZstdError,)
            stream = io.BufferedReader(_ZstdStream(file.path, zstandard), BLOCK)
        elif file.compression == "gzip":
            errors += (zlib.error,)
            stream = gzip.open(file.path, "rb")
        else:
            stream = open(file.path, "rb")
    except OSError as error:
        raise ValueError(f"{file.name} is unreadable: {error.strerror}") from None
    with stream:
        yield stream, errors


def _unreadable(file: SourceFile, error: BaseException) -> ValueError:
    what = f"{file.compression} data" if file.compression else "file"
    return ValueError(f"{file.name}: unreadable {what}: {error}")


def _lines(file: SourceFile) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, bytes with the line break) of the file's lines; a leading byte order mark dropped."""
    with _decompressed(file) as (stream, errors):
        number = 0
        while True:
            try:
                line = stream.readline()
            except errors as error:
                raise _unreadable(file, error) from None
            if not line:
                return
            number += 1
            yield number, line[len(BOM) :] if number == 1 and line.startswith(BOM) else line


def _decoded_lines(file: SourceFile, bad: BadRecords) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each line; text None (after reporting it) where the line is not UTF-8."""
    for number, line in _lines(file):
        try:
            yield number, line.decode("utf-8")
        except UnicodeDecodeError as error:
            bad(f"{file.name}:{number}", f"invalid UTF-8 at byte {error.start} of the line")
            yield number, None


def _chomp(line: str) -> str:
    return line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line


def _text_documents(file: SourceFile, text_unit: str, bad: BadRecords) -> Iterator[str]:
    if text_unit == "file":
        yield from _whole_file(file, bad)
    elif text_unit == "line":
        for _, text in _decoded_lines(file, bad):
            if text is not None and text.strip():
                yield _chomp(text)
    else:
        lines, broken = [], False  # the paragraph so far; whether one of its lines is not UTF-8
        for _, text in _decoded_lines(file, bad):
            if text is not None and not text.strip():
                if lines and not broken:
                    yield _chomp("".join(lines))
                lines, broken = [], False
            else:
                lines.append(text or "")
                broken = broken or text is None
        if lines and not broken:
            yield _chomp("".join(lines))


def _whole_file(file: SourceFile, bad: BadRecords) -> Iterator[str]:
    with _decompressed(file) as (stream, errors):
        try:
            data = stream.read()
        except errors as error:
            raise _unreadable(file, error) from None
    data = data[len(BOM) :] if data.startswith(BOM) else data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        bad(f"{file.name}:{line}", f"invalid UTF-8 at byte {error.start} of the file")
        return
    if text.strip():
        yield text


def _jsonl_documents(file: SourceFile, field: str, bad: BadRecords) -> Iterator[str]:
    base = file.name.lower()
    base = base.rpartition(".")[0] if file.compression else base
    hint = " (a .json file is read as JSON Lines: one object per line)" if base.endswith(".json") else ""
    for number, text in _decoded_lines(file, bad):
        if text is None or not text.strip():
            continue
        where = f"{file.name}:{number}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            bad(where, f"not JSON: {error.msg} at column {error.colno}{hint}")
            continue
        except RecursionError:
            bad(where, "JSON nested too deeply")
            continue
        if not isinstance(record, dict):
            bad(where, f"{_json_type(record)}, not a JSON object{hint}")
        elif field not in record:
            bad(where, f"no field {field!r}; its fields: {_listed(record)}")
        elif not isinstance(record[field], str):
            bad(where, f"field {field!r} is {_json_type(record[field])}, not a string")
        else:
            yield record[field]


def _json_type(value) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), "a value")


def _listed(names, most: int = 10) -> str:
    names = list(names)
    return ", ".join(map(repr, names[:most])) + (f" and {len(names) - most} more" if len(names) > most else "") if names else "none"


def _column_documents(file: SourceFile, field: str, bad: BadRecords) -> Iterator[str]:
    pa = _need("pyarrow", f"{file.name}: reading {file.format} files")
    reading = _parquet_batches if file.format == "parquet" else _arrow_batches
    with contextlib.ExitStack() as stack:
        try:
            batches = reading(file, field, pa, stack)
        except (pa.ArrowException, OSError) as error:
            raise ValueError(f"{file.name}: not a readable {file.format} file: {error}") from None
        row = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as error:
                raise ValueError(f"{file.name}: unreadable {file.format} data after row {row}: {error}") from None
            if batch is None:
                return
            for value in batch.column(field).to_pylist():
                if value is None:
                    bad(f"{file.name}:row {row}", f"{field!r} is null")
                else:
                    yield value
                row += 1


def _parquet_batches(file: SourceFile, field: str, pa, stack: contextlib.ExitStack) -> Iterator:
    parquet = _need("pyarrow.parquet", f"{file.name}: reading parquet files")
    reader = stack.enter_context(contextlib.closing(parquet.ParquetFile(file.path)))
    _check_string_column(file, reader.schema_arrow, field, pa)
    return reader.iter_batches(batch_size=BATCH_ROWS, columns=[field])


def _arrow_batches(file: SourceFile, field: str, pa, stack: contextlib.ExitStack) -> Iterator:
    source = stack.enter_context(pa.memory_map(str(file.path)))
    try:
        reader = pa.ipc.open_file(source)
        batches = (reader.get_batch(index) for index in range(reader.num_record_batches))
    except pa.ArrowInvalid:  # not the IPC file format: the stream format (`datasets` writes it)
        source.seek(0)
        reader = batches = pa.ipc.open_stream(source)
    _check_string_column(file, reader.schema, field, pa)
    return iter(batches)


def _check_string_column(file: SourceFile, schema, field: str, pa) -> None:
    if field not in schema.names:
        raise ValueError(f"{file.name}: no column {field!r}; its columns: {_listed(schema.names)}")
    kind = schema.field(field).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    string_view = getattr(pa.types, "is_string_view", lambda kind: False)
    if not (pa.types.is_string(values) or pa.types.is_large_string(values) or string_view(values)):
        raise ValueError(f"{file.name}: column {field!r} holds {kind}, not strings")


def file_digest(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            while block := stream.read(BLOCK):
                digest.update(block)
    except OSError as error:
        raise ValueError(f"{str(path)!r} is unreadable: {error.strerror}") from None
    return digest.hexdigest()


def parse_hub_source(spec: str) -> tuple[str, str | None, str]:
    """(NAME, CONFIG or None, SPLIT, default "train") of ``hf:NAME[:config=CONFIG][:split=SPLIT]``."""
    if not spec.startswith(HUB_PREFIX):
        raise ValueError(f"source {spec!r} is not of the form {HUB_PREFIX}NAME[:config=CONFIG][:split=SPLIT]")
    name, *parts = spec[len(HUB_PREFIX) :].split(":")
    options = {}
    for part in parts:
        key, equals, value = part.partition("=")
        if not equals or key not in HUB_OPTIONS or key in options or not value:
            raise ValueError(f"source {spec!r}: options after the name are {' and '.join(k + '=VALUE' for k in HUB_OPTIONS)}, got {part!r}")
        options[key] = value
    if not name:
        raise ValueError(f"source {spec!r} names no dataset: {HUB_PREFIX}NAME[:config=CONFIG][:split=SPLIT]")
    return name, options.get("config"), options.get("split", "train")


def hub_documents(spec: str, *, field: str = "text", bad: BadRecords | None = None) -> Iterator[str]:
    """The ``field`` of each row of ``hf:NAME[:config=CONFIG][:split=SPLIT]``, in order.

    Loaded by ``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train", streaming=True)``: rows
    are streamed, nothing is downloaded whole. NAME is a Hugging Face hub dataset (read from the hub when
    it can be reached, from the ``datasets`` cache offline) or a local folder of data files laid out like a
    hub repository (jsonl, parquet, csv...). A row whose field is missing, null or not a string is a bad
    record ``hf:...:row N`` (rows counted from 0); a field the dataset's columns lack is a ValueError.
    """
    name, config, split = parse_hub_source(spec)
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must be a non-empty column name, got {field!r}")
    bad = BadRecords() if bad is None else bad
    datasets = _need("datasets", f"source {spec!r}: reading {HUB_PREFIX} datasets")
    try:
        rows = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as error:  # datasets raises many kinds: missing data, split or config; network; formats
        raise ValueError(f"source {spec!r}: datasets.load_dataset failed: {type(error).__name__}: {error}") from error
    features = rows.features
    if features is not None:
        if field not in features:
            raise ValueError(f"source {spec!r}: no column {field!r}; its columns: {_listed(features)}")
        if getattr(features[field], "dtype", None) not in ("string", "large_string", "string_view"):
            raise ValueError(f"source {spec!r}: column {field!r} holds {features[field]}, not strings")
    return _hub_rows(spec, rows, field, bad)


def _hub_rows(spec: str, rows, field: str, bad: BadRecords) -> Iterator[str]:
    for index, row in enumerate(rows):
        value = row.get(field)
        if isinstance(value, str):
            yield value
        elif field not in row:
            bad(f"{spec}:row {index}", f"no field {field!r}; its fields: {_listed(row)}")
        else:
            bad(f"{spec}:row {index}", f"{field!r} is {'null' if value is None else type(value).__name__}, not a string")
