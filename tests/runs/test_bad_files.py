"""Every file tokenmix reads, damaged: a ValueError that names the file and says what is wrong.

``KINDS`` is a table of file kinds: how to write a valid copy (``make``, into a folder), which file
of it is damaged (``file``), how the library reads it (``read``), and which corruptions apply
(``variants``: a name and a function from the valid file's bytes to damaged bytes). The corruptions
are built generically from the valid file: emptied, truncated at several points, random bytes,
invalid UTF-8, JSON of the wrong type at the top or at one key, a key removed or added, tensors of
the wrong shape or dtype, rows of the wrong width or with a wrong label. Each variant is read and
must raise ValueError naming the file (its basename): not another exception, and not be accepted.
``test_a_valid_copy_is_read`` reads each kind undamaged first, so a refusal is the damage's doing.
A few variants go through the command line too (exit status 2, one line, no traceback). The caches
under $TOKENMIX_CACHE are the exception: a damaged entry is made again, not an error; and so is the
torn last line a killed writer leaves in metrics.jsonl: it is dropped. A model folder's config that
asks for far more than its weights hold (``OVERSIZED``: dim 10^9, depth 10^7, 10^12 parameters) is
refused from the weights' header, with no model built but on the meta device.

The property-based tests (hypothesis, derandomized so CI never flakes) drive the parsers with
arbitrary input, where they find more than hand-written cases: ``read_model_config`` (the
migrations, then ``ModelConfig.from_dict``), a model folder's config of any sizes,
``StreamState.from_plain``, ``read_metrics``, ``read_records``, the TSV and metadata readers, the
CIFAR-10 batch reader and the Pathfinder image decoder; each must give a result or a ValueError.

These tests fail when a reader's error handling breaks. Checked by hand: narrowing the ``except``
of ``tokenmix.runs.folder.read_json`` to ``OSError`` makes 26 variants of ``model/config.json``
and of the export's JSON files fail: json's and UTF-8's own errors (ValueErrors, but naming no file)
reach the caller. Removing the ``isinstance(data, dict)`` check of ``StreamState.from_plain`` makes
its property test fail with AttributeError (on ``data=None``); the checkpoint variants still pass
there, as ``check_resumable`` refuses a segment state that is not a dict before it is rebuilt.
In ``tokenmix.runs.weights``: without ``check_sizes`` the dim, depth and vocab_size oversized
tests fail (another message); without ``parameters_at_most`` the expand and rpe_dim ones fail and the
rpe_layers one runs for minutes; building the checked model off the meta device fails three of them;
catching no RuntimeError or TypeError there fails the sizes property test (at its examples).
Reading metrics.jsonl in ``tokenmix eval`` outside ``user_input()`` fails its two commands; refusing
a torn last line in ``read_metrics`` fails the three torn-line tests.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import struct
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from conftest import TINY_RUN, usage_error
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

import tokenmix
from tokenmix.bench.compare import comparison_rows, condition_differences, read_records
from tokenmix.cli import main
from tokenmix.data.corpus import load_corpus
from tokenmix.data.glue import load_glue
from tokenmix.data.listops import read_listops
from tokenmix.data.lra_image import load_lra_image
from tokenmix.data.lra_pathfinder import _pixels, load_lra_pathfinder
from tokenmix.data.lra_retrieval import load_lra_retrieval
from tokenmix.data.lra_text import load_lra_text
from tokenmix.data.sources import load_data
from tokenmix.data.tokenizer import byte_tokenizer
from tokenmix.data.wikitext import load_wikitext
from tokenmix.models.config import FORMAT_KEYS, FORMAT_VERSION, ModelConfig
from tokenmix.models.model import SequenceModel
from tokenmix.runs import open_run
from tokenmix.runs.checkpoint import save_checkpoint
from tokenmix.runs.metrics import read_metrics, training_cost
from tokenmix.runs.migrations import read_model_config
from tokenmix.state import STATE_TYPE_KEY, StreamState
from tokenmix.train import TrainConfig, Trainer
from tokenmix.train.finetune import finetuned_task

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
Variant = Callable[[bytes], bytes]


# --- generic corruptions -------------------------------------------------------------------------


def _random_bytes(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, max(size, 16), dtype=np.uint8).tobytes()


def byte_variants(cuts=(1, 0.25, 0.5, 0.75, -2), empty: bool = True, random: bool = True) -> dict[str, Variant]:
    """Emptied, cut short (after one byte, at fractions of the file, without its last two bytes: a JSON
    file's closing brace and line end), random bytes."""
    variants: dict[str, Variant] = {"empty": lambda data: b""} if empty else {}
    for cut in cuts:
        label = {1: "1 byte", -2: "all but the last 2 bytes"}.get(cut, f"{cut:.0%}")
        variants[f"cut to {label}"] = lambda data, cut=cut: data[: cut if cut in (1, -2) else int(len(data) * cut)]
    if random:
        variants["random bytes"] = lambda data: _random_bytes(len(data))
    return variants


def invalid_utf8(data: bytes) -> bytes:
    """A byte that is never UTF-8 (0xff) inside the first string of a JSON file, or after the first letter of a text."""
    at = data.find(b'"') + 1 if data.lstrip()[:1] in (b"{", b"[") else next(i for i, byte in enumerate(data) if chr(byte).isalpha()) + 1
    return data[:at] + b"\xff\xfe" + data[at:]


def other_type(value, which: int):
    """A JSON-like value of another type than ``value`` (two choices per type)."""
    if isinstance(value, bool):
        return ("yes", 2)[which]
    if isinstance(value, (int, float)):
        return (str(value), [value])[which]
    if isinstance(value, str):
        return (7, [value])[which]
    if isinstance(value, (list, tuple)):
        return ({"items": list(value)}, "text")[which]
    if isinstance(value, dict):
        return ([1], "text")[which]
    if isinstance(value, torch.Tensor):
        return ("text", value.tolist())[which]
    return ("text", [1])[which]  # None


def _walk(value, path: str):
    """(container, last key) of a dotted ``path`` ("rng.numpy.keys", "optimizer.state.0.exp_avg")."""
    *parents, last = path.split(".")
    for part in parents:
        value = value[int(part)] if isinstance(value, list) or int_key(value, part) else value[part]
    return value, (int(last) if isinstance(value, list) or int_key(value, last) else last)


def int_key(mapping, part: str) -> bool:
    return isinstance(mapping, dict) and part.isdigit() and int(part) in mapping


def set_at(path: str, make):
    def edit(value):
        container, key = _walk(value, path)
        container[key] = make(container[key])

    return edit


def drop(path: str):
    def edit(value):
        container, key = _walk(value, path)
        del container[key]

    return edit


def edit_variants(keys=(), missing=(), top_level=True, unknown=True) -> dict[str, Callable]:
    """Structured edits (functions that change a decoded value in place, or return a new one)."""
    variants = {}
    if top_level:
        for name, value in {"a list": [], "a string": "text", "a number": 1, "null": None}.items():
            variants[f"top level {name}"] = lambda _, value=value: ("replace", value)
    for key in keys:
        for which in (0, 1):
            variants[f"{key} of another type ({which + 1})"] = set_at(key, lambda old, which=which: other_type(old, which))
    for key in missing:
        variants[f"{key} missing"] = drop(key)
    if unknown:
        variants["an unknown key"] = lambda value: value.update(surprise=1)
    return variants


def through(decode, encode, edits: dict[str, Callable]) -> dict[str, Variant]:
    """Byte variants applying each edit to the decoded file."""

    def variant(edit):
        def apply(data: bytes) -> bytes:
            value = decode(data)
            changed = edit(value)
            if isinstance(changed, tuple) and changed[:1] == ("replace",):
                value = changed[1]
            return encode(value)

        return apply

    return {name: variant(edit) for name, edit in edits.items()}


def json_variants(**options) -> dict[str, Variant]:
    return through(json.loads, lambda value: json.dumps(value).encode(), edit_variants(**options))


def json_edits(edits: dict[str, Callable]) -> dict[str, Variant]:
    return through(json.loads, lambda value: json.dumps(value).encode(), edits)


def _torch_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def checkpoint_variants(edits: dict[str, Callable]) -> dict[str, Variant]:
    return through(lambda data: torch.load(io.BytesIO(data), weights_only=True), _torch_bytes, edits)


def safetensors_variants(edits: dict[str, Callable]) -> dict[str, Variant]:
    return through(safetensors.torch.load, lambda tensors: safetensors.torch.save(tensors), edits)


def safetensors_header(edit) -> Variant:
    """Change the JSON header of a safetensors file (8 bytes of length, the header, the data)."""

    def apply(data: bytes) -> bytes:
        size = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + size])
        edit(header)
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + data[8 + size :]

    return apply


def _first_tensor(header: dict) -> dict:
    return next(entry for key, entry in header.items() if key != "__metadata__")


def lines_variant(edit) -> Variant:
    """Change a line-based file: ``edit`` takes and returns its list of lines (without line ends)."""

    def apply(data: bytes) -> bytes:
        ending = b"\r\n" if b"\r\n" in data else b"\n"
        return ending.join(edit(data.split(ending)[:-1])) + ending

    return apply


def tsv_variants(header: bool, label: int | None, text: int | None, label_values=(b"7", b"x")) -> dict[str, Variant]:
    """Rows of the wrong width, wrong labels, invalid UTF-8 in a text field, a row cut after its first field, ..."""

    def at_row(change):
        def edit(lines):
            k = 2 if header else 1  # a row in the middle of the file (the fixtures write at least 4)
            lines[k] = change(lines[k].split(b"\t"))
            return lines

        return lines_variant(edit)

    variants = {
        "a row with a field less": at_row(lambda fields: b"\t".join(fields[:-1])),
        "a row with a field more": at_row(lambda fields: b"\t".join([*fields, b"extra"])),
        "a row cut after its first field": at_row(lambda fields: fields[0] + b"\t"),
        "a row without tabs": at_row(lambda fields: b" ".join(fields)),
    }
    for value in label_values if label is not None else ():
        variants[f"label {value.decode()!r}"] = at_row(
            lambda fields, value=value: b"\t".join([*fields[:label], value, *fields[label + 1 :]])
        )
    if text is not None:
        variants["invalid UTF-8 in a text"] = at_row(
            lambda fields: b"\t".join([*fields[:text], fields[text] + b"\xff", *fields[text + 1 :]])
        )
    if header:
        variants["the header only"] = lines_variant(lambda lines: lines[:1])
        variants["no header"] = lines_variant(lambda lines: lines[1:])
    return variants


# --- the valid files -----------------------------------------------------------------------------


def _copy_run(name: str):
    def make(folder: Path, runs: dict) -> None:
        shutil.copytree(runs[name], folder / "run")
        config = torch.load(folder / "run" / "checkpoint.pt", weights_only=True)["train_config"]
        (folder / "train_config.json").write_text(json.dumps(config))  # what a resume is asked for

    return make


def _resume(folder: Path):
    """A resume of the run in ``folder`` with the settings it was trained with, to step 3."""
    config = json.loads((folder / "train_config.json").read_text())
    trainer = Trainer(TrainConfig.from_dict({**config, "out": str(folder / "run"), "steps": 3}), resume=True, progress=False)
    trainer.run()


def _export(folder: Path, runs: dict) -> None:
    shutil.copytree(runs["export"], folder / "export")


def _check_export(folder: Path):
    from tokenmix.hf.export import check_export

    check_export(folder / "export")


def _bench(folder: Path, runs: dict) -> None:
    base = {"kind": "mixer", "mixer": "tno", "causal": False, "length": 8, "forward_ms": 1.0, "forward_backward_ms": 3.0}
    records = [base, {**base, "length": 16, "dim": 8, "threads": 1}, {**base, "kind": "model", "mixer": "tnn", "error": None}]
    (folder / "bench.json").write_text(json.dumps(records, indent=1))


def _compare(folder: Path):
    records = read_records(str(folder / "bench.json"))
    return comparison_rows(records, records), condition_differences(records, records)


TEXT = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer.\n" * 8


def _corpus(folder: Path, runs: dict) -> None:
    (folder / "corpus.txt").write_text(TEXT)
    (folder / "enwik").write_bytes(TEXT.encode())
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text(f" = Title = \n {split} text <unk> .\n" + TEXT)


def _bpe(source: str):
    return lambda folder: load_data(source.format(folder=folder), 16, tokenizer="bpe:300")


GLUE = {  # task: (folder, header or None, a row, the label column, a text column)
    "cola": ("CoLA", None, "gj04\t1\t\tThe book was read .", 1, 3),
    "sst2": ("SST-2", "sentence\tlabel", "the play was good .\t1", 1, 0),
    "mrpc": ("MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t11\t12\tIt rained .\tRain fell .", 0, 3),
    "qqp": ("QQP", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "0\t1\t2\tWhy ?\tHow ?\t0", 5, 3),
    "stsb": ("STS-B", "index\tsentence1\tsentence2\tscore", "0\tA man .\tA person .\t3.8", 3, 1),
    "mnli": ("MNLI", "index\tgenre\tsentence1\tsentence2\tgold_label", "0\tfic\tIt is .\tIt is not .\tneutral", 4, 2),
    "qnli": ("QNLI", "index\tquestion\tsentence\tlabel", "0\tWho ?\tHe did .\tentailment", 3, 1),
    "rte": ("RTE", "index\tsentence1\tsentence2\tlabel", "0\tIt rains .\tIt is wet .\tnot_entailment", 3, 1),
}


def _glue(task: str):
    folder_name, header, row, _, _ = GLUE[task]

    def make(folder: Path, runs: dict) -> None:
        (folder / folder_name).mkdir()
        splits = ("train", "dev_matched", "dev_mismatched") if task == "mnli" else ("train", "dev")
        for split in splits:
            rows = ([header] if header else []) + [row] * 5
            (folder / folder_name / f"{split}.tsv").write_text("\n".join(rows) + "\n")

    return make


LISTOPS_ROWS = ["( ( ( [MAX 2 ) 9 ) ] )\t9", "( ( [SM 4 ) 7 ) ] )\t1", "( ( ( [MIN 3 ) 5 ) ] )\t3", "8\t8", "( ( [MED 1 ) 6 ) ] )\t3"]


def _listops(folder: Path, runs: dict) -> None:
    (folder / "listops-1000").mkdir()
    for split in ("train", "val", "test"):
        (folder / "listops-1000" / f"basic_{split}.tsv").write_bytes(("Source\tTarget\r\n" + "\r\n".join(LISTOPS_ROWS) + "\r\n").encode())


def _imdb(folder: Path, runs: dict) -> None:
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            (folder / "aclImdb" / split / label).mkdir(parents=True)
            for k in range(10):
                (folder / "aclImdb" / split / label / f"{k}_{2 if label == 'neg' else 9}.txt").write_text(
                    f"A {label} review {k} caf\u00e9."
                )


def _aan(folder: Path, runs: dict) -> None:
    (folder / "tsv_data").mkdir()
    for split in ("train", "eval", "test"):
        rows = [f"{k % 2}\tP{k}-1\tW{k}-2\tpaper {k} text\tcited {k} text" for k in range(5)]
        (folder / "tsv_data" / f"new_aan_pairs.{split}.tsv").write_text("\n".join(rows) + "\n")


CIFAR_BATCHES = (*(f"data_batch_{k}" for k in range(1, 6)), "test_batch")


def _cifar_python(folder: Path, runs: dict) -> None:
    (folder / "cifar-10-batches-py").mkdir()
    rng = np.random.default_rng(0)
    for name in CIFAR_BATCHES:
        batch = {b"batch_label": b"fixture", b"labels": [0, 1, 2, 3], b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8)}
        (folder / "cifar-10-batches-py" / name).write_bytes(pickle.dumps(batch, protocol=2))


def _cifar_binary(folder: Path, runs: dict) -> None:
    (folder / "cifar-10-batches-bin").mkdir()
    rng = np.random.default_rng(0)
    for name in CIFAR_BATCHES:
        records = np.concatenate([np.arange(4, dtype=np.uint8)[:, None], rng.integers(0, 256, (4, 3072), dtype=np.uint8)], axis=1)
        (folder / "cifar-10-batches-bin" / f"{name}.bin").write_bytes(records.tobytes())


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PATHFINDER = Path("pathfinder32") / "curv_contour_length_14"


def _pathfinder(folder: Path, runs: dict) -> None:
    base, rng = folder / PATHFINDER, np.random.default_rng(0)
    (base / "metadata").mkdir(parents=True)
    for k in range(2):
        (base / "imgs" / str(k)).mkdir(parents=True)
        lines = []
        for i in range(10):
            (base / "imgs" / str(k) / f"sample_{i}.png").write_bytes(_png(rng.integers(0, 256, (32, 32), dtype=np.uint8)))
            lines.append(f"imgs/{k} sample_{i}.png {i} {i % 2} 1.0 6 2 2 0.5 1 1\n")
        (base / "metadata" / f"{k}.npy").write_text("".join(lines))


# --- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    make: Callable[[Path, dict], None]  # write a valid copy into the folder (``runs``: the session's tiny runs)
    file: str  # the file that is damaged, relative to the folder
    read: Callable[[Path], object]  # read it as tokenmix does
    variants: dict[str, Variant]


CHECKPOINT_LOADING = {
    **edit_variants(keys=("model_config", "train_config", "model", "step", "checkpoint_format", "tokenizer"), unknown=False),
    **{f"{key} missing": drop(key) for key in ("model_config", "train_config", "model", "step", "checkpoint_format")},
    "format 99": set_at("checkpoint_format", lambda _: 99),
    "step -1": set_at("step", lambda _: -1),
    "the weight matrices transposed": lambda state: state["model"].update(
        {k: v.t().contiguous() for k, v in state["model"].items() if v.dim() == 2}
    ),
    "a weight of ints": lambda state: state["model"].update({k: v.int() for k, v in list(state["model"].items())[:1]}),
    "a weight missing": lambda state: state["model"].pop(next(iter(state["model"]))),
    "an extra weight": lambda state: state["model"].update(extra=torch.zeros(2)),
    "a weight that is a list": lambda state: state["model"].update({k: v.tolist() for k, v in list(state["model"].items())[:1]}),
    "a weight under an int key": lambda state: state["model"].update({0: torch.zeros(2)}),
    "model_config with an unknown key": set_at("model_config", lambda config: {**config, "surprise": 1}),
    "model_config of an unknown model": set_at("model_config.name", lambda _: "no_such_model"),
    "model_config with an unknown option": set_at("model_config.options", lambda options: {**options, "surprise": 1}),
    "model_config dim 0": set_at("model_config.dim", lambda _: 0),
    "model_config dim of another type": set_at("model_config.dim", lambda _: "8"),
    "model_config under an int key": set_at("model_config", lambda config: {**config, 0: 1}),
    "train_config without data": drop("train_config.data"),
    "train_config data of another type": set_at("train_config.data", lambda _: 7),
    "train_config seq_len of another type": set_at("train_config.seq_len", lambda _: "16"),
    "train_config without seed": drop("train_config.seed"),
    "tokenizer not JSON": set_at("tokenizer", lambda _: "not json"),
    "tokenizer an empty JSON object": set_at("tokenizer", lambda _: "{}"),
    "tokenizer not byte level": set_at("tokenizer", lambda text: text.replace('"ByteLevel"', '"Metaspace"')),
}
CHECKPOINT_RESUME = {
    **edit_variants(
        keys=("optimizer", "scheduler", "rng", "total_steps", "train_seconds", "resumes", "data_files", "segment_states"),
        missing=("optimizer", "scheduler", "rng"),
        top_level=False,
        unknown=False,
    ),
    **edit_variants(
        keys=(
            "rng.torch",
            "rng.numpy",
            "rng.numpy.keys",
            "rng.numpy.position",
            "rng.python",
            "rng.python.internal",
            "rng.python.version",
            "optimizer.state",
            "optimizer.param_groups",
            "optimizer.state.0",
            "optimizer.state.0.exp_avg",
            "scheduler.base_lrs",
            "scheduler.last_epoch",
            "scheduler._last_lr",
            "train_config.options",
        ),
        missing=("rng.numpy", "rng.python.internal", "optimizer.state", "optimizer.param_groups", "scheduler.base_lrs", "rng.torch"),
        top_level=False,
        unknown=False,
    ),
    "rng.torch of floats": set_at("rng.torch", lambda tensor: tensor.float()),
    "rng.torch cut short": set_at("rng.torch", lambda tensor: tensor[:100].clone()),
    "rng.numpy.keys cut short": set_at("rng.numpy.keys", lambda tensor: tensor[:10].clone()),
    "rng.python.internal cut short": set_at("rng.python.internal", lambda values: values[:10]),
    "an optimizer moment transposed": set_at("optimizer.state.0.exp_avg", lambda tensor: tensor.t().contiguous()),
    "an optimizer moment of another size": set_at("optimizer.state.2.exp_avg_sq", lambda tensor: torch.zeros(7)),
    "an optimizer step of another shape": set_at("optimizer.state.0.step", lambda tensor: torch.zeros(3)),
    "an optimizer group missing": set_at("optimizer.param_groups", lambda groups: groups[:1]),
    "an optimizer group without params": drop("optimizer.param_groups.0.params"),
    "an optimizer group with a string lr": set_at("optimizer.param_groups.0.lr", lambda _: "fast"),
    "a schedule with one base lr": set_at("scheduler.base_lrs", lambda values: values[:1]),
    "a schedule with a string lr": set_at("scheduler.base_lrs", lambda values: ["fast"] * len(values)),
    "data_files with an entry of another type": set_at("data_files", lambda files: {name: 1 for name in files}),
    "data_files under an int key": set_at("data_files", lambda files: {0: {"bytes": 1, "sha256": "x"}, **files}),
    "two segment states for one process": set_at("segment_states", lambda states: [None, {"position": 1}]),
    "a segment state that is a number": set_at("segment_states", lambda states: [1]),
    "a segment state of no class": set_at("segment_states", lambda states: [{"position": 1}]),
    "train_config with an unknown key": set_at("train_config", lambda config: {**config, "surprise": 1}),
    "train_config with a bad lr": set_at("train_config.lr", lambda _: -1.0),
    "total_steps -5": set_at("total_steps", lambda _: -5),
    "a resume record of another type": set_at("resumes", lambda _: [1]),
}
XL_SEGMENT = "segment_states.0.blocks.0"
CHECKPOINT_XL = {
    **edit_variants(
        keys=(XL_SEGMENT, f"{XL_SEGMENT}.memory", f"{XL_SEGMENT}.position", "segment_states.0.blocks"), top_level=False, unknown=False
    ),
    "a segment memory transposed": set_at(f"{XL_SEGMENT}.memory", lambda tensor: tensor.transpose(1, 2).contiguous()),
    "a segment memory of another width": set_at(f"{XL_SEGMENT}.memory", lambda tensor: torch.zeros(*tensor.shape[:2], 3)),
    "a segment memory of another batch": set_at(f"{XL_SEGMENT}.memory", lambda tensor: torch.cat([tensor, tensor])),
    "a segment memory in float64": set_at(f"{XL_SEGMENT}.memory", lambda tensor: tensor.double()),
    "a segment memory of ints": set_at(f"{XL_SEGMENT}.memory", lambda tensor: tensor.long()),
    "a segment of another length than its mask": set_at(
        f"{XL_SEGMENT}.segment", lambda tensor: torch.zeros(tensor.shape[0], 3, tensor.shape[2])
    ),
    "a segment state without memory": drop(f"{XL_SEGMENT}.memory"),
    "a segment state with an extra field": set_at(XL_SEGMENT, lambda state: {**state, "surprise": torch.zeros(1)}),
    "a segment state with an int key": set_at(XL_SEGMENT, lambda state: {**state, 0: torch.zeros(1)}),
    "a segment state of an unknown class": set_at(f"{XL_SEGMENT}.{STATE_TYPE_KEY}", lambda _: "NoSuchState"),
    "a block state in place of the model's": set_at("segment_states.0", lambda state: state["blocks"][0]),
    "a segment state of no block": set_at("segment_states.0.blocks", lambda blocks: []),
    "a segment state of another model": set_at("segment_states.0.model", lambda _: "tnn"),
}
MODEL_CONFIG_KEYS = (
    "name",
    "task",
    "vocab_size",
    "dim",
    "depth",
    "num_classes",
    "options",
    "pool",
    "documents",
    "format_version",
    "tokenmix_version",
)
# Configs that ask for far more than their weights (those of the tiny runs: vocabulary 256, dim 8, depth 1) hold: (key, value,
# the message naming the mismatch). Refused from the weights' header, no model built but on the meta device.
OVERSIZED = {
    "dim 10^9": ("dim", 10**9, r"asks for dim 1000000000, but its weights hold embedding.weight of shape \(256, 8\)"),
    "depth 10^7": ("depth", 10**7, "asks for depth 10000000, but its weights hold the blocks of depth 1"),
    "vocab_size 10^11 (10^12 parameters)": ("vocab_size", 10**11, r"asks for vocab_size 100000000000, but .* of shape \(256, 8\)"),
    "expand 10^10 (10^12 parameters)": ("options.expand", 10**10, r"more parameters than the \d+ tensors .*: Linear.weight of shape \(8"),
    "rpe_layers 10^7": ("options.mixer.rpe_layers", 10**7, r"more parameters than the \d+ tensors \([\d,]+ elements\) of its weights"),
    "rpe_dim 10^12": ("options.mixer.rpe_dim", 10**12, r"more parameters than .*: Linear.weight of shape \(1000000000000, 1\)"),
}


def oversized(prefix: str = "") -> dict[str, Variant]:
    """The ``OVERSIZED`` configs, of a config whose tokenmix config lies at ``prefix`` ("tokenmix." in an export's)."""
    return json_edits({name: set_at(prefix + key, lambda _, value=value: value) for name, (key, value, _) in OVERSIZED.items()})


MODEL_CONFIG = {
    **json_variants(
        keys=(*MODEL_CONFIG_KEYS, "options.mixer.rpe_dim", "options.mixer.activation", "options.mixer.decay"), missing=MODEL_CONFIG_KEYS
    ),
    **json_edits(
        {
            "an unknown option": set_at("options", lambda options: {**options, "surprise": 1}),
            "another width than the weights": set_at("dim", lambda _: 16),
            "format 99": set_at("format_version", lambda _: 99),
        }
    ),
    **oversized(),
}
WEIGHTS = {
    **safetensors_variants(
        {
            "the weight matrices transposed": lambda tensors: tensors.update(
                {k: v.t().contiguous() for k, v in tensors.items() if v.dim() == 2}
            ),
            "a weight of ints": lambda tensors: tensors.update({k: v.int() for k, v in list(tensors.items())[:1]}),
            "a weight of bools": lambda tensors: tensors.update({k: v > 0 for k, v in list(tensors.items())[:1]}),
            "a weight missing": lambda tensors: tensors.pop(next(iter(tensors))),
            "an extra weight": lambda tensors: tensors.update(extra=torch.zeros(2)),
            "no weights": lambda tensors: tensors.clear(),
            "an embedding of fewer rows": lambda tensors: tensors.update({"embedding.weight": tensors["embedding.weight"][:100].clone()}),
            "no blocks": lambda tensors: ("replace", {k: v for k, v in tensors.items() if not k.startswith("blocks.")}),
        }
    ),
    "a header with a dtype no model has": safetensors_header(lambda header: _first_tensor(header).update(dtype="U32")),
    "a header longer than the file": lambda data: struct.pack("<Q", 1 << 40) + data[8:],
    "a header that is not JSON": lambda data: (
        data[:8] + b"\x00" * struct.unpack("<Q", data[:8])[0] + data[8 + struct.unpack("<Q", data[:8])[0] :]
    ),
    "a header with offsets past the data": safetensors_header(lambda header: _first_tensor(header).update(data_offsets=[0, 1 << 30])),
    "a header with an unknown dtype": safetensors_header(lambda header: _first_tensor(header).update(dtype="F7")),
    "a header whose shape disagrees with its offsets": safetensors_header(lambda header: _first_tensor(header).update(shape=[3, 3, 3])),
    "a header that is a list": safetensors_header(lambda header: header.clear() or header.update({"a": []})),
}
TOKENIZER = {
    **json_variants(
        keys=("model", "decoder", "added_tokens", "pre_tokenizer", "model.vocab", "model.merges", "model.type"), missing=("model",)
    ),
    **json_edits(
        {
            "an empty vocabulary": set_at("model.vocab", lambda _: {}),
            "a token id of another type": set_at("model.vocab.a", lambda _: "97"),
            "a token outside the byte-level alphabet": set_at("model.vocab", lambda vocab: {**vocab, "\u4e00": 999}),
            "a negative token id": set_at("model.vocab.a", lambda _: -3),
        }
    ),
}
METRICS = {
    "random bytes": lambda data: _random_bytes(len(data)),
    "invalid UTF-8": invalid_utf8,
    "a line that is not JSON": lambda data: b"not json\n" + data,
    "a line cut short, not the last": lambda data: data[: len(data) // 2] + b"\n" + data,
    "a JSON array": lambda data: b"[1, 2]\n" + data,
    "a JSON string": lambda data: b'"step"\n' + data,
    "null": lambda data: b"null\n" + data,
    "a string step": lambda data: b'{"step": "1"}\n' + data,
    "a fractional step": lambda data: b'{"step": 1.5}\n' + data,
    "a boolean step": lambda data: b'{"step": true}\n' + data,
}
RECORD_KEYS = ("kind", "mixer", "causal", "length", "forward_ms", "forward_backward_ms")
BENCH = {
    **byte_variants(),
    "invalid UTF-8": invalid_utf8,
    **json_variants(
        keys=(*(f"0.{key}" for key in RECORD_KEYS), "1.dim", "1.threads"),
        missing=tuple(f"0.{key}" for key in RECORD_KEYS[1:]),
        unknown=False,
    ),
    **json_edits(
        {
            "an empty object": lambda _: ("replace", {}),
            "a record that is a list": set_at("0", lambda _: [1]),
            "a negative time": set_at("0.forward_ms", lambda _: -1.0),
            "a boolean time": set_at("0.forward_ms", lambda _: True),
            "length 0": set_at("0.length", lambda _: 0),
            "an error that is a list": set_at("2.error", lambda _: ["failed"]),
        },
    ),
}
EXPORT_SETTINGS = {
    **byte_variants(cuts=(1, 0.5, -2)),
    "invalid UTF-8": invalid_utf8,
    **json_variants(unknown=False),
}


def _cifar_edit(edits):
    return through(pickle.loads, lambda value: pickle.dumps(value, protocol=2), edits)  # pickle.loads: the fixture's own files


CIFAR_PYTHON = {
    **byte_variants(),
    **_cifar_edit(
        {
            "a list, not a dict": lambda _: ("replace", [1, 2]),
            "no data": lambda batch: batch.pop(b"data"),
            "no labels": lambda batch: batch.pop(b"labels"),
            "str keys": lambda batch: ("replace", {key.decode(): value for key, value in batch.items()}),
            "data of floats": lambda batch: batch.update({b"data": batch[b"data"].astype(np.float32)}),
            "data of another width": lambda batch: batch.update({b"data": batch[b"data"][:, :1000].copy()}),
            "data of one dimension": lambda batch: batch.update({b"data": batch[b"data"].reshape(-1)}),
            "data as lists": lambda batch: batch.update({b"data": batch[b"data"].tolist()}),
            "a label missing": lambda batch: batch.update({b"labels": batch[b"labels"][:-1]}),
            "label 10": lambda batch: batch.update({b"labels": [10, 1, 2, 3]}),
            "label -1": lambda batch: batch.update({b"labels": [-1, 1, 2, 3]}),
            "a string label": lambda batch: batch.update({b"labels": ["3", 1, 2, 3]}),
            "a fractional label": lambda batch: batch.update({b"labels": [2.5, 1, 2, 3]}),
            "a boolean label": lambda batch: batch.update({b"labels": [True, 1, 2, 3]}),
            "labels as a number": lambda batch: batch.update({b"labels": 3}),
        }
    ),
}
CIFAR_BINARY = {
    **byte_variants(cuts=(1, 0.4, -2)),  # (half of the fixture's four records is two whole ones)
    "a byte more": lambda data: data + b"\x00",
    "label 10": lambda data: b"\x0a" + data[1:],
    "label 255": lambda data: b"\xff" + data[1:],
}
PATHFINDER_METADATA = {
    **byte_variants(cuts=()),
    "a line cut after its second field": lines_variant(lambda lines: [b" ".join(lines[1].split()[:2]), *lines]),
    "invalid UTF-8": invalid_utf8,
    "a line of three fields": lines_variant(lambda lines: [b" ".join(lines[1].split()[:3]), *lines]),
    "label 2": lines_variant(lambda lines: [b" ".join([*lines[1].split()[:3], b"2", *lines[1].split()[4:]]), *lines]),
    "label x": lines_variant(lambda lines: [b" ".join([*lines[1].split()[:3], b"x", *lines[1].split()[4:]]), *lines]),
    "an empty line list": lambda data: b"\n\n",
}


def _finetuning(path: Path) -> None:
    """Read ``path`` as ``tokenmix finetune`` reads the model it starts from."""
    finetuned_task(open_run(path), path)


KINDS: dict[str, Kind] = {
    "checkpoint.pt (loading)": Kind(
        _copy_run("lm"),
        "run/checkpoint.pt",
        lambda f: open_run(f / "run"),
        {**byte_variants(), **checkpoint_variants(CHECKPOINT_LOADING)},
    ),
    "checkpoint.pt (fine-tuning)": Kind(
        _copy_run("mlm"),
        "run/checkpoint.pt",
        lambda f: _finetuning(f / "run"),
        checkpoint_variants(
            {key: CHECKPOINT_LOADING[key] for key in ("top level a list", "model missing", "tokenizer not JSON", "model_config dim 0")}
        ),
    ),
    "checkpoint.pt (resume)": Kind(_copy_run("lm"), "run/checkpoint.pt", _resume, checkpoint_variants(CHECKPOINT_RESUME)),
    "checkpoint.pt (XL resume)": Kind(_copy_run("xl"), "run/checkpoint.pt", _resume, checkpoint_variants(CHECKPOINT_XL)),
    "model/config.json": Kind(
        _copy_run("lm"),
        "run/model/config.json",
        lambda f: tokenmix.open_run(f / "run" / "model").model,
        {**byte_variants(), "invalid UTF-8": invalid_utf8, **MODEL_CONFIG},
    ),
    "model/model.safetensors": Kind(
        _copy_run("lm"),
        "run/model/model.safetensors",
        lambda f: tokenmix.open_run(f / "run" / "model").model,
        {**byte_variants(), **WEIGHTS},
    ),
    "tokenizer.json": Kind(
        _copy_run("lm"),
        "run/tokenizer.json",
        lambda f: tokenmix.Tokenizer.load(f / "run"),
        {**byte_variants(), "invalid UTF-8": invalid_utf8, **TOKENIZER},
    ),
    "model/tokenizer.json (fine-tuning)": Kind(
        _copy_run("mlm"),
        "run/model/tokenizer.json",
        lambda f: _finetuning(f / "run" / "model"),
        {"random bytes": byte_variants()["random bytes"], **json_variants(keys=("model",))},
    ),
    "model/config.json (fine-tuning)": Kind(
        _copy_run("mlm"),
        "run/model/config.json",
        lambda f: _finetuning(f / "run" / "model"),
        {key: MODEL_CONFIG[key] for key in ("top level a list", "another width than the weights", *OVERSIZED)},
    ),
    "model/model.safetensors (fine-tuning)": Kind(
        _copy_run("mlm"),
        "run/model/model.safetensors",
        lambda f: _finetuning(f / "run" / "model"),
        {key: WEIGHTS[key] for key in ("a header that is not JSON", "a weight missing", "an embedding of fewer rows", "no blocks")},
    ),
    "metrics.jsonl": Kind(_copy_run("lm"), "run/metrics.jsonl", lambda f: read_metrics(f / "run" / "metrics.jsonl"), METRICS),
    "metrics.jsonl (training cost)": Kind(_copy_run("lm"), "run/metrics.jsonl", lambda f: training_cost(f / "run"), METRICS),
    "metrics.jsonl (resume)": Kind(_copy_run("lm"), "run/metrics.jsonl", _resume, METRICS),
    "bench records": Kind(_bench, "bench.json", _compare, BENCH),
    "export config.json": Kind(
        _export,
        "export/config.json",
        _check_export,
        {
            **byte_variants(cuts=(1, 0.5, -2)),
            "invalid UTF-8": invalid_utf8,
            **json_variants(
                keys=(
                    "tokenmix",
                    "model_type",
                    "architectures",
                    "dtype",
                    "segment_length",
                    "pad_token_id",
                    "tie_word_embeddings",
                    "use_cache",
                    "tokenmix.dim",
                    "hidden_size",
                    "vocab_size",
                ),
                missing=("tokenmix", "model_type", "architectures"),
                unknown=False,
            ),
            **json_edits(
                {
                    "another architecture": set_at("architectures", lambda _: ["TokenmixForMaskedLM"]),
                    "an unknown architecture": set_at("architectures", lambda _: ["NoSuchModel"]),
                    "an unknown dtype": set_at("dtype", lambda _: "float7"),
                    "an end-of-document id past the vocabulary": set_at("eos_token_id", lambda _: 9999),
                    "a string end-of-document id": set_at("eos_token_id", lambda _: "</s>"),
                    "a negative segment length": set_at("segment_length", lambda _: -3),
                    "another hidden size": set_at("hidden_size", lambda _: 5),
                },
            ),
            **oversized("tokenmix."),
        },
    ),
    "export model.safetensors": Kind(
        _export,
        "export/model.safetensors",
        _check_export,
        {
            **byte_variants(cuts=(1, 0.5, -2)),
            **{
                k: WEIGHTS[k]
                for k in ("the weight matrices transposed", "a weight missing", "an extra weight", "a header that is not JSON")
            },
        },
    ),
    "export tokenizer.json": Kind(
        _export,
        "export/tokenizer.json",
        _check_export,
        {**byte_variants(cuts=(1, 0.5, -2)), **{k: TOKENIZER[k] for k in ("top level a list", "model missing", "an empty vocabulary")}},
    ),
    "export tokenizer_config.json": Kind(
        _export,
        "export/tokenizer_config.json",
        _check_export,
        {
            **EXPORT_SETTINGS,
            **json_variants(keys=("model_max_length", "padding_side", "mask_token", "tokenizer_class"), top_level=False, unknown=False),
            **json_edits(
                {
                    "padding on no side": set_at("padding_side", lambda _: "middle"),
                    "a mask that is no token": set_at("mask_token", lambda _: "<zzz>"),
                },
            ),
        },
    ),
    "export generation_config.json": Kind(
        _export,
        "export/generation_config.json",
        _check_export,
        {
            **EXPORT_SETTINGS,
            **json_variants(keys=("use_cache", "output_attentions"), top_level=False, unknown=True),
            **json_edits(
                {
                    "a string max_new_tokens": lambda c: c.update(max_new_tokens="20"),
                    "a string do_sample": lambda c: c.update(do_sample="yes"),
                    "a string end-of-document id": lambda c: c.update(eos_token_id="x"),
                    "an end-of-document id past the vocabulary": lambda c: c.update(eos_token_id=9999),
                    "no beams": lambda c: c.update(num_beams=0),
                    "a string temperature": lambda c: c.update(temperature="hot"),
                },
            ),
        },
    ),
    "text corpus": Kind(
        _corpus,
        "corpus.txt",
        lambda f: load_corpus(str(f / "corpus.txt")),
        {"empty": lambda data: b"", "cut to 50 bytes": lambda data: data[:50]},
    ),
    "text corpus (BPE)": Kind(
        _corpus, "corpus.txt", _bpe("{folder}/corpus.txt"), {"invalid UTF-8": invalid_utf8, "empty": lambda data: b""}
    ),
    "bytes:FILE": Kind(
        _corpus,
        "enwik",
        lambda f: load_corpus(f"bytes:{f / 'enwik'}"),
        {"empty": lambda data: b"", "cut to 50 bytes": lambda data: data[:50]},
    ),
    "wiki.valid.tokens": Kind(
        _corpus, "wiki.valid.tokens", lambda f: load_wikitext(str(f)), {"empty": lambda data: b"", "cut to 1 byte": lambda data: data[:1]}
    ),
    "wiki.train.tokens (BPE)": Kind(_corpus, "wiki.train.tokens", _bpe("wikitext:{folder}"), {"invalid UTF-8": invalid_utf8}),
    **{
        f"glue {task}": Kind(
            _glue(task),
            f"{GLUE[task][0]}/train.tsv",
            lambda f, task=task: load_glue(task, f),
            {
                **byte_variants(cuts=(1,)),
                **{
                    name: variant
                    for name, variant in tsv_variants(GLUE[task][1] is not None, GLUE[task][3], GLUE[task][4]).items()
                    if not (task == "qqp" and name in ("a row with a field less", "a row cut after its first field", "a row without tabs"))
                },
            },
        )
        for task in GLUE
    },
    "glue sst2 dev.tsv": Kind(
        _glue("sst2"), "SST-2/dev.tsv", lambda f: load_glue("sst2", f), {"empty": lambda data: b"", **tsv_variants(True, 1, 0)}
    ),
    "listops basic_train.tsv": Kind(
        _listops,
        "listops-1000/basic_train.tsv",
        lambda f: read_listops(f),
        {
            **byte_variants(cuts=(1, 0.5)),
            **tsv_variants(True, 1, 0, label_values=(b"10", b"x", b"-1")),
            "an unknown word": lines_variant(lambda lines: [lines[0], b"( ( [POW 2 ) 9 ) ] )\t1", *lines[1:]]),
        },
    ),
    "lra-text review": Kind(_imdb, "aclImdb/train/pos/3_9.txt", lambda f: load_lra_text(f), {"empty": lambda data: b""}),
    "lra-retrieval tsv": Kind(
        _aan,
        "tsv_data/new_aan_pairs.eval.tsv",
        lambda f: load_lra_retrieval(f),
        {**byte_variants(cuts=(1,)), **tsv_variants(False, 0, None, (b"2", b"x", b"nan", b"0.5"))},
    ),
    "lra-image python batch": Kind(_cifar_python, "cifar-10-batches-py/data_batch_2", lambda f: load_lra_image(f), CIFAR_PYTHON),
    "lra-image binary batch": Kind(_cifar_binary, "cifar-10-batches-bin/test_batch.bin", lambda f: load_lra_image(f), CIFAR_BINARY),
    "lra-pathfinder metadata": Kind(
        _pathfinder, str(PATHFINDER / "metadata" / "1.npy"), lambda f: load_lra_pathfinder(f), PATHFINDER_METADATA
    ),
    "lra-pathfinder image": Kind(
        _pathfinder,
        str(PATHFINDER / "imgs" / "1" / "sample_3.png"),
        lambda f: load_lra_pathfinder(f),
        {
            "16 x 16 pixels": lambda data: _png(np.zeros((16, 16), np.uint8)),
            "32 x 33 pixels": lambda data: _png(np.zeros((33, 32), np.uint8)),
        },
    ),
}
CASES = [(kind, variant) for kind, spec in KINDS.items() for variant in spec.variants]


def test_the_variants_are_many():
    assert len(CASES) >= 200, len(CASES)


def test_the_config_fields_are_the_latest_format_keys():
    """The model config variants remove each key of the latest format, which ``from_dict`` requires."""
    assert FORMAT_KEYS[FORMAT_VERSION] == set(VALID_CONFIG) == set(MODEL_CONFIG_KEYS)


@pytest.fixture(scope="module")
def valid(tiny_runs, tmp_path_factory) -> dict[str, Path]:
    """A valid folder of each kind, written once (tests copy it)."""
    root = tmp_path_factory.mktemp("valid")
    runs = dict(tiny_runs)
    runs["xl"] = root / "xl_run"
    flags = ["--data", str(tiny_runs["lm"].parent / "corpus.txt"), *TINY_RUN, "--steps", "1", "--model", "transformer_xl"]
    assert main(["train", *flags, "-o", "memory_length=4", "--out", str(runs["xl"]), "--threads", "1"]) == 0
    folders = {}
    for name, kind in KINDS.items():
        folders[name] = root / f"kind{len(folders)}"
        folders[name].mkdir()
        kind.make(folders[name], runs)
    return folders


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "cache"))


def _case(valid, tmp_path, kind: str) -> Path:
    folder = tmp_path / "case"
    shutil.copytree(valid[kind], folder)
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_a_valid_copy_is_read(valid, tmp_path, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KINDS[kind].read(_case(valid, tmp_path, kind))


@pytest.mark.parametrize(("kind", "variant"), CASES, ids=[f"{kind}: {variant}" for kind, variant in CASES])
def test_a_damaged_file_is_a_value_error_that_names_it(valid, tmp_path, kind, variant):
    spec = KINDS[kind]
    folder = _case(valid, tmp_path, kind)
    path = folder / spec.file
    damaged = spec.variants[variant](path.read_bytes())
    path.write_bytes(damaged)
    with pytest.raises(ValueError) as error:
        spec.read(folder)
    assert path.name in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("variant", OVERSIZED)
def test_an_oversized_config_is_refused_before_a_model_is_built(valid, tmp_path, monkeypatch, variant):
    """The mismatch named, and no model built but on the meta device (none at all for the sizes the header bounds)."""
    folder = _case(valid, tmp_path, "model/config.json")
    path = folder / KINDS["model/config.json"].file
    path.write_bytes(MODEL_CONFIG[variant](path.read_bytes()))
    devices = []

    def build(config):
        devices.append(torch.get_default_device().type)
        assert devices[-1] == "meta", "a model built for real before its config was checked"
        return SequenceModel(config)

    monkeypatch.setattr("tokenmix.runs.weights.SequenceModel", build)  # the check's model
    monkeypatch.setattr("tokenmix.runs.open.SequenceModel", build)  # the model open_run builds
    with pytest.raises(ValueError, match=OVERSIZED[variant][2]):
        tokenmix.open_run(path.parent)


@pytest.mark.parametrize("variant", OVERSIZED)
def test_an_oversized_checkpoint_config_is_refused_before_a_model_is_built(tmp_path, variant):
    """A training checkpoint's model config is checked against its weights as a model folder's is (eval,
    generate, export-hf, distil, serve and finetune read checkpoints)."""
    model = tokenmix.build_model("tnn", vocab_size=256, dim=8, depth=1)
    config = model.config.to_dict()
    key, value, message = OVERSIZED[variant]
    *parents, last = key.split(".")
    inner = config
    for parent in parents:
        inner = inner[parent]
    inner[last] = value
    state = {
        "model_config": config,
        "train_config": {"data": "shakespeare", "seq_len": 32, "seed": 0},
        "model": model.state_dict(),
        "step": 1,
        "tokenizer": byte_tokenizer().to_json(),
    }
    save_checkpoint(tmp_path / "checkpoint.pt", state)
    with pytest.raises(ValueError, match=message):
        open_run(tmp_path)
    with pytest.raises(ValueError, match=message):
        _finetuning(tmp_path)


METRICS_READERS = [kind for kind, spec in KINDS.items() if spec.file == "run/metrics.jsonl"]


@pytest.mark.parametrize("kind", METRICS_READERS)
def test_a_torn_last_metrics_line_is_dropped(valid, tmp_path, kind):
    """What a writer killed mid-record leaves (the start of a record, no line end) is not an error."""
    folder = _case(valid, tmp_path, kind)
    path = folder / KINDS[kind].file
    path.write_bytes(path.read_bytes() + b'{"step": 2, "lo')
    KINDS[kind].read(folder)


# --- through the command line --------------------------------------------------------------------

COMMANDS = [
    ("checkpoint.pt (loading)", "random bytes", ["eval", "{folder}/run"]),
    ("checkpoint.pt (loading)", "the weight matrices transposed", ["generate", "{folder}/run", "--max-new-tokens", "2"]),
    ("checkpoint.pt (loading)", "train_config without data", ["export-hf", "{folder}/run", "{folder}/out"]),
    ("checkpoint.pt (resume)", "rng.numpy.keys cut short", ["train", "--resume", "--out", "{folder}/run", "--steps", "3"]),
    ("checkpoint.pt (resume)", "train_config with an unknown key", ["train", "--resume", "--out", "{folder}/run", "--steps", "3"]),
    ("checkpoint.pt (XL resume)", "a segment memory transposed", ["train", "--resume", "--out", "{folder}/run", "--steps", "3"]),
    ("tokenizer.json", "invalid UTF-8", ["generate", "{folder}/run", "--max-new-tokens", "2"]),
    (
        "model/config.json",
        "dim of another type (1)",
        ["finetune", "{folder}/run/model", "--out", "{folder}/out", "--data", "listops:max_length=40:train=8:val=4:test=4"],
    ),
    (
        "model/config.json",
        "depth 10^7",
        ["finetune", "{folder}/run/model", "--out", "{folder}/out", "--data", "listops:max_length=40:train=8:val=4:test=4"],
    ),
    ("metrics.jsonl (training cost)", "invalid UTF-8", ["eval", "{folder}/run"]),
    ("metrics.jsonl (training cost)", "a line that is not JSON", ["eval", "{folder}/run"]),
    ("metrics.jsonl (resume)", "a line cut short, not the last", ["train", "--resume", "--out", "{folder}/run", "--steps", "3"]),
    ("bench records", "a record that is a list", ["compare", "{folder}/bench.json", "{folder}/bench.json"]),
    ("export generation_config.json", "no beams", ["generate", "{folder}/export", "--transformers", "--max-new-tokens", "2"]),
    (
        "listops basic_train.tsv",
        "invalid UTF-8 in a text",
        ["train", "--data", "listops:{folder}", "--task", "classify", "--out", "{folder}/out"],
    ),
    (
        "lra-image python batch",
        "a fractional label",
        ["train", "--data", "lra-image:{folder}", "--task", "classify", "--out", "{folder}/out"],
    ),
]


@pytest.mark.parametrize(("kind", "variant", "command"), COMMANDS, ids=[f"{c[2][0]} {c[0]}: {c[1]}" for c in COMMANDS])
def test_commands_refuse_a_damaged_file_in_one_line(valid, tmp_path, capsys, kind, variant, command):
    if kind.startswith("export"):
        pytest.importorskip("transformers")
    spec = KINDS[kind]
    folder = _case(valid, tmp_path, kind)
    path = folder / spec.file
    path.write_bytes(spec.variants[variant](path.read_bytes()))
    error = usage_error([part.format(folder=folder) for part in command], capsys)
    assert path.name in error and not (folder / "out").exists(), error


# --- caches: a damaged entry is made again -------------------------------------------------------

CACHE_ENTRIES = {
    **byte_variants(cuts=(1, 0.5, -2)),
    "floats": lambda data: _npy(np.zeros(4, np.float32)),
    "two dimensions": lambda data: _npy(np.zeros((2, 2), np.int32)),
    "ids past the vocabulary": lambda data: _npy(np.full(4, 10**6, np.int32)),
    "negative ids": lambda data: _npy(np.full(4, -1, np.int32)),
    "an object array": lambda data: _npy(np.array([None, 1], dtype=object), allow_pickle=True),
}


def _npy(array, allow_pickle=False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


@pytest.mark.parametrize("variant", CACHE_ENTRIES)
def test_a_damaged_token_cache_entry_is_made_again(tmp_path, variant):
    from tokenmix.data.tokenized import cached_encode

    tokenizer = tokenmix.train_bpe(TEXT.encode(), 300)
    ids, _ = cached_encode(tokenizer, TEXT.encode())
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    entry.write_bytes(CACHE_ENTRIES[variant](entry.read_bytes()))
    again, note = cached_encode(tokenizer, TEXT.encode())
    assert torch.equal(again, ids) and "cached" in note and "read from the cache" not in note
    assert torch.equal(cached_encode(tokenizer, TEXT.encode())[0], ids)  # and the entry was written again


@pytest.mark.parametrize("variant", [*byte_variants(cuts=(1, 0.5, -2)), "invalid UTF-8", "not byte level", "top level a list"])
def test_a_damaged_bpe_cache_entry_is_learnt_again(tmp_path, variant):
    from tokenmix.data.tokenized import resolve_tokenizer

    learnt = resolve_tokenizer("bpe:300", TEXT.encode())
    (entry,) = (tmp_path / "cache" / "bpe").iterdir()
    changes = {
        **byte_variants(cuts=(1, 0.5, -2)),
        "invalid UTF-8": invalid_utf8,
        "not byte level": lambda data: data.replace(b'"ByteLevel"', b'"Metaspace"'),
        "top level a list": lambda data: b"[]",
    }
    entry.write_bytes(changes[variant](entry.read_bytes()))
    assert resolve_tokenizer("bpe:300", TEXT.encode()) == learnt
    assert entry.read_bytes() == learnt.to_json().encode()


# --- Pathfinder images: an undecodable one is skipped with a warning that names it ---------------


@pytest.mark.parametrize("variant", ["empty", "cut to 50%", "random bytes", "a broken checksum", "a bomb"])
def test_an_undecodable_pathfinder_image_is_skipped_with_a_warning_that_names_it(valid, tmp_path, variant):
    folder = _case(valid, tmp_path, "lra-pathfinder image")
    path = folder / KINDS["lra-pathfinder image"].file
    data = path.read_bytes()
    changes = {
        "empty": b"",
        "cut to 50%": data[: len(data) // 2],
        "random bytes": _random_bytes(len(data)),
        "a broken checksum": data[:29] + bytes([data[29] ^ 0xFF]) + data[30:],  # the IHDR chunk's CRC
        "a bomb": _png_header(60000, 60000),
    }
    path.write_bytes(changes[variant])
    with pytest.warns(UserWarning, match=r"skipped 1 empty or undecodable images of 20 \(first: .*imgs/1/sample_3.png\)"):
        data = load_lra_pathfinder(folder)
    assert len(data.train) + len(data.val) + len(data.test) == 19


def _png_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
    )


# --- property-based: arbitrary input to the parsers ----------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
VALID_CONFIG = ModelConfig("tnn", dim=8, depth=1, options={"rpe_dim": 4}).to_dict()


def _refused_or(value, call):
    try:
        return call(value)
    except ValueError:
        return None


@FUZZ
@given(
    st.dictionaries(st.sampled_from(sorted(VALID_CONFIG)) | st.text(max_size=4), JSON, max_size=6)
    | st.fixed_dictionaries({}, optional={key: JSON | st.just(value) for key, value in VALID_CONFIG.items()})
)
def test_model_config_from_any_dict_is_a_config_or_a_value_error(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # format 1 configs warn
        config = _refused_or(data, read_model_config)
    assert config is None or isinstance(config, ModelConfig)


@FUZZ
@given(
    st.fixed_dictionaries(
        {"options": st.dictionaries(st.sampled_from(sorted(VALID_CONFIG["options"])) | st.text(max_size=4), JSON, max_size=3)},
        optional={key: JSON for key in ("dim", "task", "pool", "num_classes", "documents")},
    )
)
def test_model_config_with_any_options_is_refused_or_builds_a_model(changes):
    data = {**VALID_CONFIG, **changes, "options": {**VALID_CONFIG["options"], **changes["options"]}}
    config = _refused_or(data, ModelConfig.from_dict)
    if config is not None:  # accepted: it reads back as itself and builds a model that runs
        assert ModelConfig.from_dict(json.loads(config.to_json())) == config
        options = config.options.as_dict()
        model = tokenmix.build_model(config.name, vocab_size=config.vocab_size, dim=config.dim, depth=config.depth, **options)
        model.eval()(torch.zeros(1, 5, dtype=torch.long))


SIZES = ("dim", "depth", "vocab_size", "options.expand", "options.mixer.rpe_dim", "options.mixer.rpe_layers")


@FUZZ
@given(st.dictionaries(st.sampled_from(SIZES), st.integers(0, 10**20) | st.sampled_from([1, 3, 4, 8, 256]), min_size=1, max_size=3))
@example(sizes={"dim": 8, "options.mixer.rpe_layers": 3})  # its own sizes: loads
@example(sizes={"options.expand": 10**17})  # a layer past the bytes a tensor can hold (torch: RuntimeError)
@example(sizes={"options.expand": 10**19})  # a size past 64 bits (torch: TypeError)
def test_a_model_folder_of_any_sizes_loads_or_is_a_value_error(valid, tmp_path_factory, sizes):
    """Sizes up to 10^20 in the config of a model folder: its model, or a ValueError (sizes past its weights cost nothing)."""
    folder = tmp_path_factory.mktemp("sizes") / "model"
    shutil.copytree(valid["model/config.json"] / "run" / "model", folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in sizes.items():
        set_at(key, lambda _, value=value: value)(config)
    (folder / "config.json").write_text(json.dumps(config))
    model = _refused_or(folder, lambda path: tokenmix.open_run(path).model)
    assert model is None or isinstance(model, SequenceModel)


STATE_NAMES = st.sampled_from(["ModelState", "XlState", "NoSuchState"])
PLAIN = st.recursive(
    st.none() | st.integers(-3, 3) | st.text(max_size=4) | st.builds(torch.zeros, st.integers(0, 3)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from([STATE_TYPE_KEY, "memory", "segment", "position", "blocks", "model"]) | st.integers(0, 2), children, max_size=4
        )
        | st.fixed_dictionaries(
            {STATE_TYPE_KEY: STATE_NAMES},
            optional={"blocks": children, "memory": children, "segment": children, "position": children, "model": children, 0: children},
        )
    ),
    max_leaves=10,
)


@FUZZ
@given(PLAIN)
def test_stream_state_from_any_plain_value_is_a_state_or_a_value_error(data):
    state = _refused_or(data, StreamState.from_plain)
    assert state is None or isinstance(state, StreamState)


@FUZZ
@given(
    st.lists(st.text(max_size=30) | JSON.map(json.dumps) | st.fixed_dictionaries({"step": JSON, "loss": JSON}).map(json.dumps), max_size=6)
)
def test_read_metrics_of_any_lines_is_records_or_a_value_error(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("metrics") / "metrics.jsonl"
    path.write_text("\n".join(lines))
    records = _refused_or(path, read_metrics)
    assert records is None or all(isinstance(record, dict) and type(record.get("step", 0)) is int for record in records)


BENCH_RECORD = st.fixed_dictionaries(
    {
        "mixer": st.sampled_from(["tno", "tcn"]) | JSON,
        "causal": st.booleans() | JSON,
        "length": st.integers(1, 64) | JSON,
        "forward_ms": st.floats(0.1, 5) | JSON,
        "forward_backward_ms": st.floats(0.1, 5) | JSON,
    },
    optional={
        "kind": st.sampled_from(["mixer", "model", "generate"]) | JSON,
        "error": st.none() | JSON,
        "dim": JSON,
        "threads": JSON,
    },
)


@FUZZ
@given(st.lists(BENCH_RECORD, max_size=3) | JSON)
def test_read_records_of_any_json_is_records_that_compare_or_a_value_error(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    path.write_text(json.dumps(records))
    read = _refused_or(str(path), read_records)
    if read is not None:
        comparison_rows(read, read)
        condition_differences(read, read)


TSV_FIELD = st.text(st.characters(blacklist_categories=["Cs"]), max_size=8) | st.sampled_from(["0", "1", "entailment", "3.5", "nan", "7"])
TSV_TEXT = st.lists(st.lists(TSV_FIELD, min_size=1, max_size=6).map("\t".join), max_size=5).map("\n".join)


@FUZZ
@given(st.sampled_from(sorted(GLUE)), TSV_TEXT, st.booleans())
def test_glue_files_of_any_text_are_read_or_a_value_error(tmp_path_factory, task, text, keep_header):
    folder = tmp_path_factory.mktemp("glue")
    _glue(task)(folder, {})
    header = GLUE[task][1]
    path = folder / GLUE[task][0] / "train.tsv"
    path.write_text((header + "\n" if header and keep_header else "") + text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # QQP's short rows
        data = _refused_or(task, lambda name: load_glue(name, folder))
    if data is not None:  # accepted: every split holds examples with labels of the task
        assert all(len(split) and len(split.labels) == len(split) for split in data.splits.values())
        labels = torch.cat([split.labels for split in data.splits.values()])
        assert bool(((labels >= 0) & (labels <= (5 if data.label_names is None else len(data.label_names) - 1))).all())


@FUZZ
@given(
    st.lists(st.lists(st.sampled_from(["(", ")", "[MAX", "[SM", "]", "3", "9", "x"]), max_size=8).map(" ".join), min_size=1, max_size=4),
    st.lists(TSV_FIELD, min_size=1, max_size=4),
)
def test_listops_files_of_any_rows_are_read_or_a_value_error(tmp_path_factory, expressions, labels):
    folder = tmp_path_factory.mktemp("listops")
    _listops(folder, {})
    rows = [f"{expression}\t{label}" for expression, label in zip(expressions, labels * 4, strict=False)]
    (folder / "listops-1000" / "basic_test.tsv").write_text("Source\tTarget\n" + "\n".join(rows) + "\n")
    data = _refused_or(folder, read_listops)
    assert data is None or bool((data.test.lengths() > 0).all())  # accepted: no empty expression


@FUZZ
@given(st.lists(st.lists(st.sampled_from(["imgs/0", "sample_1.png", "0", "1", "2", "x", "\u00e9"]), max_size=6).map(" ".join), max_size=4))
def test_pathfinder_metadata_of_any_lines_is_read_or_a_value_error(tmp_path_factory, lines):
    folder = tmp_path_factory.mktemp("pathfinder")
    _pathfinder(folder, {})
    (folder / PATHFINDER / "metadata" / "1.npy").write_text("\n".join(lines))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _refused_or(folder, load_lra_pathfinder)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 3072 + 3), st.integers(0, 255)), min_size=1, max_size=6), st.integers(-40, 40))
def test_cifar_binary_batches_of_any_bytes_are_read_or_a_value_error(tmp_path_factory, flips, resize):
    folder = tmp_path_factory.mktemp("cifar")
    _cifar_binary(folder, {})
    path = folder / "cifar-10-batches-bin" / "data_batch_1.bin"
    data = bytearray(path.read_bytes())
    for at, value in flips:
        data[at] = value
    path.write_bytes(bytes(data[: len(data) + resize] if resize < 0 else data + bytes(resize)))
    _refused_or(folder, load_lra_image)


@FUZZ
@given(st.binary(max_size=40), st.integers(0, 200))
@example(junk=b"\x00\x00\x00e", at=129)  # APPENDS on a dict: pickle raised AttributeError (found by CI's fuzzing)
def test_cifar_python_batches_of_any_bytes_are_read_or_a_value_error(tmp_path_factory, junk, at):
    folder = tmp_path_factory.mktemp("cifar")
    _cifar_python(folder, {})
    path = folder / "cifar-10-batches-py" / "data_batch_1"
    data = path.read_bytes()
    path.write_bytes(data[:at] + junk + data[at + len(junk) :])
    _refused_or(folder, load_lra_image)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_pathfinder_image_of_any_bytes_decodes_or_is_skipped(flips):
    data = bytearray(_png(np.arange(32 * 32, dtype=np.uint8).reshape(32, 32)))
    for at, value in flips:
        data[at % len(data)] = value
    pixels = _pixels(bytes(data))
    assert pixels is None or isinstance(pixels, np.ndarray)
