"""``tokenmix prepare`` and ``--data DIR`` of prepared shards: the documented format read back with numpy, the
same files whatever the process count, an interrupted prepare continued, training that reads the shards in
place (and resumes exactly), and each bad input in one line."""

import hashlib
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_RUN, fill

from tokenmix.cli import main
from tokenmix.data import load_data, random_windows, step_generator
from tokenmix.data.batches import document_lm_batch
from tokenmix.data.prepare import FINISHED, MANIFEST, PrepareOptions, finished_chunks, prepare
from tokenmix.data.prepared import TokenFiles
from tokenmix.data.shard_encoder import SPLITS
from tokenmix.data.tokenizer import byte_tokenizer, train_bpe
from tokenmix.errors import MachineFault
from tokenmix.runs.checkpoint import load_checkpoint
from tokenmix.train import TrainConfig, Trainer

WORDS = ["the", "quiet", "river", "runs", "under", "old", "stone", "bridges", "où", "naïve", "東京", "\n", "\n\n", ",", "."]
SMALL_CHUNKS = PrepareOptions(chunk_mb=4096 / (1 << 20), val_fraction=0.2, test_fraction=0.2)


def write_corpus(folder: Path, files: int, words: int, seed: int = 0) -> list[str]:
    """``files`` text files of random words (one document each); their texts in reading order."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for index in range(files):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))
        (folder / f"doc{index:03d}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("corpus") / "texts"
    return folder, write_corpus(folder, 60, 400)


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe("\n".join(corpus[1]).encode(), 300)


def read_documents_back(folder: Path) -> dict[str, list[list[int]]]:
    """Each split's documents as the format doc says to read them: numpy memmaps of the .bin files, cut by the .idx offsets."""
    manifest = json.loads((folder / MANIFEST).read_text())
    documents = {split: [] for split in SPLITS}
    for chunk in manifest["chunks"]:
        for split in SPLITS:
            if split in chunk:
                name = f"{split}-{chunk['chunk']:05d}"
                tokens = np.memmap(folder / f"{name}.bin", dtype=manifest["dtype"], mode="r")
                offsets = np.fromfile(folder / f"{name}.idx", dtype="<i8")
                documents[split] += [tokens[start:end].tolist() for start, end in zip(offsets[:-1], offsets[1:], strict=True)]
    return documents


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_each_document_is_its_ids_then_the_separator_in_the_split_its_hash_gives(kind, corpus, bpe, tmp_path):
    folder, texts = corpus
    tokenizer = byte_tokenizer() if kind == "bytes" else bpe
    manifest = prepare([str(folder)], tokenizer, tmp_path / "out", SMALL_CHUNKS)
    separator = 10 if kind == "bytes" else tokenizer.end_of_document_id
    assert manifest["separator"] == separator and manifest["dtype"] == "uint16" and len(manifest["chunks"]) > 3
    expected = {split: [] for split in SPLITS}
    for text in texts:
        u = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64  # as docs/data.md says
        expected["val" if u < 0.2 else "test" if u < 0.4 else "train"].append([*tokenizer.encode(text).tolist(), separator])
    assert read_documents_back(tmp_path / "out") == expected
    assert all(expected[split] for split in SPLITS)
    for split in SPLITS:
        assert manifest["splits"][split] == {"documents": len(expected[split]), "tokens": sum(map(len, expected[split]))}
    assert not (tmp_path / "out" / "prepare.json").exists() and not (tmp_path / "out" / "chunks.jsonl").exists()


def test_two_worker_processes_write_the_files_one_writes(corpus, bpe, tmp_path):
    folder, _ = corpus
    prepare([str(folder)], bpe, tmp_path / "one", SMALL_CHUNKS)
    prepare([str(folder)], bpe, tmp_path / "two", SMALL_CHUNKS, workers=2)
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "two")


def test_a_prepared_split_reads_as_the_tensor_of_its_ids(corpus, bpe, tmp_path):
    """Slices across shard files, and the random windows a training step draws, equal those of the ids in memory."""
    folder, _ = corpus
    prepare([str(folder)], bpe, tmp_path / "out", SMALL_CHUNKS)
    data = load_data(str(tmp_path / "out"), 16)
    assert data.tokenizer == bpe
    for split in SPLITS:
        whole = torch.tensor([token for document in read_documents_back(tmp_path / "out")[split] for token in document])
        mapped = data.split(split)
        assert isinstance(mapped, TokenFiles) and mapped.numel() == len(whole) and len(mapped.paths) > 1
        for start, stop in [(0, 1), (0, len(whole)), (5, len(whole) - 3), (len(whole) - 1, len(whole) + 9)]:
            assert torch.equal(mapped[start:stop], whole[start:stop])
        for step in range(3):
            drawn = random_windows(mapped, 4, 33, step_generator(0, step))
            assert torch.equal(drawn, random_windows(whole, 4, 33, step_generator(0, step)))


def train_arguments(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), *TINY_RUN, "-o", "rpe_dim=4", "--eval-every", "2", "--out", str(out), *extra]


def tiny_run(data: Path, out: Path) -> TrainConfig:
    return TrainConfig(
        data=str(data), dim=8, depth=1, seq_len=16, batch_size=2, steps=4, eval_every=2, eval_tokens=64, final_eval_tokens=64, out=str(out)
    )


def test_training_on_a_prepared_folder_resumes_exactly(corpus, bpe, tmp_path):
    """Two steps, a save and a kill, a resume: the weights of the run never stopped."""
    folder, _ = corpus
    prepare([str(folder)], bpe, tmp_path / "data", SMALL_CHUNKS)
    Trainer(tiny_run(tmp_path / "data", tmp_path / "straight"), progress=False).run()
    interrupted = Trainer(tiny_run(tmp_path / "data", tmp_path / "resumed"), progress=False)
    for _ in range(2):
        interrupted.log({"step": interrupted.step + 1, "loss": interrupted.train_step()[0]})
    interrupted.save()
    interrupted.release_lock()
    Trainer(tiny_run(tmp_path / "data", tmp_path / "resumed"), resume=True, progress=False).run()
    straight, resumed = (load_checkpoint(tmp_path / name / "checkpoint.pt")["model"] for name in ("straight", "resumed"))
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_an_interrupted_prepare_continues_after_its_last_finished_chunk(tmp_path, bpe):
    """``tokenmix prepare`` killed (SIGKILL) once chunks are finished; run again, it keeps them (the files are
    not rewritten) and ends with what an uninterrupted run writes."""
    folder = tmp_path / "texts"
    write_corpus(folder, 150, 1000, seed=1)
    bpe.save(tmp_path / "tokenizer.json")
    arguments = ["prepare", str(folder), "--tokenizer", str(tmp_path / "tokenizer.json"), "--chunk-mb", "0.01"]  # default --workers
    assert main([*arguments, "--out", str(tmp_path / "straight")]) == 0
    out = tmp_path / "out"
    command = [sys.executable, "-m", "tokenmix.cli", *arguments, "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        finished = (out / "chunks.jsonl").read_text().count("\n") if (out / "chunks.jsonl").is_file() else 0
        if finished >= 3:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    process.wait()
    assert process.returncode == -signal.SIGKILL and not (out / MANIFEST).exists(), "prepare ended before it was killed"
    assert not workers_of(out, deadline=time.time() + 10), "its worker processes outlived it"
    recorded = finished_chunks(out / FINISHED)  # a chunk whose files were written but not yet recorded is redone
    kept = {path.name: path.stat().st_mtime_ns for path in out.glob("*.bin") if chunk_of(path) in recorded}
    assert kept
    assert main([*arguments, "--out", str(out)]) == 0
    assert all((out / name).stat().st_mtime_ns == mtime for name, mtime in kept.items())
    assert folder_bytes(out) == folder_bytes(tmp_path / "straight")


def chunk_of(shard: Path) -> int:
    """The chunk number in a shard's name, ``{split}-NNNNN.bin``."""
    return int(shard.stem.rsplit("-", 1)[1])


def workers_of(out: Path, deadline: float) -> list[int]:
    """The processes whose command line names ``out`` (a killed prepare's workers), once they are gone or at ``deadline``."""
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            try:
                command = (entry / "cmdline").read_bytes()
                if entry.name.isdigit() and str(out).encode() in command and b"tokenmix.cli" in command:
                    alive.append(int(entry.name))
            except OSError:
                continue
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture
def prepared(corpus, tmp_path) -> Path:
    folder, _ = corpus
    prepare([str(folder)], byte_tokenizer(), tmp_path / "data", SMALL_CHUNKS)
    return tmp_path / "data"


def one_error_line(arguments: list[str], capsys, status: int = 2) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    error = capsys.readouterr().err
    assert stopped.value.code == status and "Traceback" not in error, error
    return error.strip().splitlines()[-1]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-2])


def scramble_offsets(path: Path) -> None:
    offsets = np.fromfile(path, dtype="<i8")
    offsets[1], offsets[2] = offsets[2], offsets[1]
    offsets.tofile(path)


BREAKAGES = {
    "a truncated shard": ("train-00001.bin", truncate, "train-00001.bin holds"),
    "a corrupt index": ("train-00001.idx", scramble_offsets, "train-00001.idx is corrupt"),
    "a shard the manifest lists gone": ("val-00000.bin", Path.unlink, "val-00000.bin is missing"),
    "a manifest that is not JSON": (MANIFEST, lambda path: path.write_text("{"), "manifest.json is unreadable"),
    "a tokenizer other than the manifest's": ("tokenizer.json", None, "tokenizer.json is not the tokenizer the manifest names"),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_prepared_folder_is_refused_in_one_line_naming_the_file(breakage, prepared, bpe, tmp_path, capsys):
    name, damage, message = BREAKAGES[breakage]
    if damage is None:
        bpe.save(prepared / name)
    else:
        damage(prepared / name)
    error = one_error_line(train_arguments(prepared, tmp_path / "run", "--steps", "1"), capsys)
    assert error.startswith(f"tokenmix train: error: data '{prepared}'") and message in error, error


def test_a_tokenizer_other_than_the_folders_is_refused(prepared, bpe, tmp_path, capsys):
    bpe.save(tmp_path / "other.json")
    error = one_error_line(train_arguments(prepared, tmp_path / "run", "--steps", "1", "--tokenizer", str(tmp_path / "other.json")), capsys)
    assert "holds ids of its own tokenizer (bytes" in error and "leave --tokenizer out" in error, error


def test_ids_past_the_vocabulary_stop_training_in_one_line_naming_the_file(prepared, tmp_path, capsys):
    """A shard corrupted where sizes still match: found as it is read."""
    shard = prepared / "train-00000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[:] = 4000
    ids.tofile(shard)
    with pytest.raises(MachineFault, match="train-00000.bin' is corrupt: id 4000"):
        load_data(str(prepared), 16).train[0:10]
    error = one_error_line(train_arguments(prepared, tmp_path / "run", "--steps", "50"), capsys, status=1)
    assert "train-00000.bin' is corrupt" in error, error


def test_a_bad_jsonl_record_stops_prepare_in_one_line_or_is_counted_with_skip_bad(tmp_path, capsys):
    source = tmp_path / "records.jsonl"
    lines = [json.dumps({"text": f"document {index} " * 20}) for index in range(30)]
    lines[7], lines[12] = "{not json", json.dumps({"title": "no text"})
    source.write_text("\n".join(lines) + "\n")
    error = one_error_line(["prepare", str(source), "--out", str(tmp_path / "out")], capsys)
    assert error.startswith("tokenmix prepare: error: records.jsonl:8:"), error
    assert main(["prepare", str(source), "--out", str(tmp_path / "skipped"), "--skip-bad"]) == 0
    manifest = json.loads((tmp_path / "skipped" / MANIFEST).read_text())
    assert manifest["skipped_records"] == 2 and sum(totals["documents"] for totals in manifest["splits"].values()) == 28


def test_a_source_changed_since_it_was_prepared_is_refused(corpus, tmp_path, capsys):
    folder = tmp_path / "texts"
    shutil.copytree(corpus[0], folder)
    arguments = ["prepare", str(folder), "--out", str(tmp_path / "out")]
    assert main(arguments) == 0
    (folder / "doc003.txt").write_text("changed")
    error = one_error_line(arguments, capsys)
    assert "holds a dataset prepared from other inputs (doc003.txt changed since" in error, error


def test_a_full_disk_stops_prepare_in_one_line_and_a_second_run_finishes(small_disk, tmp_path, capsys):
    """On a real full disk: exit status 1, one line naming the file; the finished chunks kept; room made, the
    same command ends with the files of a run that never failed."""
    folder = tmp_path / "texts"
    write_corpus(folder, 200, 3000, seed=2)
    arguments = ["prepare", str(folder), "--chunk-mb", "0.1"]
    assert main([*arguments, "--out", str(tmp_path / "straight")]) == 0
    fill(small_disk)
    (small_disk / "filler").write_bytes(bytes(7 << 20))  # room for a few chunks, not for all
    out = small_disk / "out"
    error = one_error_line([*arguments, "--out", str(out)], capsys, status=1)
    assert error.startswith(f"tokenmix prepare: cannot write '{out}/") and "the disk is full" in error, error
    assert (out / "chunks.jsonl").is_file() and not (out / MANIFEST).exists()
    (small_disk / "filler").unlink()
    assert main([*arguments, "--out", str(out)]) == 0
    assert folder_bytes(out) == folder_bytes(tmp_path / "straight")


def test_windows_within_documents_hold_one_document_each_and_pad_the_short(prepared):
    """Every row of a ``windows=within`` batch is a stretch of one document (a short one whole, then padding that
    is masked and never a target), drawn as reproducibly as the windows that cross documents."""
    data = load_data(f"{prepared}:windows=within", 16)
    documents = [bytes(document) for document in read_documents_back(prepared)["train"]]  # byte ids: a document's bytes
    padded = 0
    for step in range(20):
        inputs, targets, mask = document_lm_batch(data.train, 4, 1024, step_generator(0, step), pad_id=0)
        again = document_lm_batch(data.train, 4, 1024, step_generator(0, step), pad_id=0)
        assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
        real = torch.ones_like(inputs, dtype=torch.bool) if mask is None else mask
        for row in range(4):
            count = int(real[row].sum())
            last = [int(targets[row, -1])] if count == 1024 else []  # a short document's separator has no target
            ids = bytes([*inputs[row, :count].tolist(), *last])
            assert any(ids in document for document in documents), row
            assert torch.equal(targets[row, : count - 1], inputs[row, 1:count])
            if count < 1024:  # the whole of a short document, then padding
                padded += 1
                assert ids in documents and (targets[row, count - 1 :] == -100).all() and (inputs[row, count:] == 0).all()
    assert padded > 0


def test_training_within_documents_and_its_refusals(prepared, tmp_path, capsys):
    assert main(train_arguments(f"{prepared}:windows=within", tmp_path / "lm", "--steps", "2")) == 0
    assert main(train_arguments(f"{prepared}:windows=within", tmp_path / "mlm", "--steps", "2", "--task", "mlm")) == 0
    error = one_error_line(train_arguments(f"{prepared}:windows=sideways", tmp_path / "bad", "--steps", "1"), capsys)
    assert "the options of a prepared folder are windows=across|within" in error, error
    xl = ["train", "--data", f"{prepared}:windows=within", *TINY_RUN, "--model", "transformer_xl", "--steps", "1"]
    xl += ["--out", str(tmp_path / "xl")]
    error = one_error_line(xl, capsys)
    assert "windows=within does not apply to the segment-recurrent 'transformer_xl'" in error, error


def test_a_bpe_prepare_run_again_keeps_its_tokenizer_and_another_vocabulary_is_refused(corpus, tmp_path, capsys, monkeypatch):
    """The second run reads the BPE the first learnt (not relearnt: the cache of learnt BPEs is emptied between)."""
    arguments = ["prepare", str(corpus[0]), "--tokenizer", "bpe:300", "--out", str(tmp_path / "out")]
    assert main(arguments) == 0
    files = folder_bytes(tmp_path / "out")
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path / "empty-cache"))
    assert main(arguments) == 0 and folder_bytes(tmp_path / "out") == files
    assert not (tmp_path / "empty-cache" / "bpe").exists()  # nothing learnt
    error = one_error_line([*arguments[:3], "bpe:400", *arguments[4:]], capsys)
    assert "holds a dataset prepared from other inputs (its tokenizer differs)" in error, error
