"""``tokenmix bench --kinds data``: tokenizing against the tokenizers library, a step's data share, peak memory by corpus size."""

import json
import os
import sys

import pytest
from conftest import usage_error

from tokenmix.bench import data as data_bench
from tokenmix.bench.corpus import MARKER, WordText, corpus_files, write_corpus
from tokenmix.bench.run import bench_tables
from tokenmix.cli import main

TINY = ["--kinds", "data", "--data-mb", "0.25", "--data-steps", "2", "--repeats", "1", "--threads", "1"]
TINY += ["--model-dim", "16", "--depth", "1", "--lengths", "32", "--batch-tokens", "64"]


@pytest.mark.slow
def test_a_tiny_data_run_writes_every_record_and_its_tables(tmp_path, capsys):
    """One corpus size (a ``tokenmix train`` child per size is most of the time; the ratio between sizes:
    test_the_tables_show_the_acceptance_ratios)."""
    output, folder = tmp_path / "data.json", tmp_path / "corpora"
    assert main(["bench", *TINY, "--data-gb", "0.001", "--data-dir", str(folder), "--output", str(output)]) == 0
    records = json.loads(output.read_text())
    assert [(r["kind"], r.get("method"), r.get("processes")) for r in records] == [
        ("data_prepare", "encode_batch", 1), ("data_prepare", "prepare", 1), ("data_prepare", "prepare", 2),
        ("data_step", None, None), ("data_memory", None, 1), ("data_memory", None, 2),
    ]  # fmt: skip
    prepares, (step, memory, parallel) = records[:3], records[3:]
    assert all(r["tokenizer"] == "bpe:4096" and r["chunks"] == 16 and r["text_bytes"] == prepares[0]["text_bytes"] for r in prepares)
    assert 0.24 * 2**20 < prepares[0]["text_bytes"] <= 0.25 * 2**20  # whole documents of the generated text
    for record in prepares:
        assert record["mib_per_second"] == pytest.approx(record["text_bytes"] / 2**20 / record["seconds"])
        assert record["seconds_runs"] == [record["seconds"]] and record["tokens"] > 0
    assert prepares[0]["cpu_per_wall"] < 1.3  # tokenizers on one thread (its default: every core)
    assert prepares[1]["tokens"] == prepares[2]["tokens"] > prepares[0]["tokens"]  # the same shards, a separator per document more
    assert (step["model"], step["dim"], step["depth"], step["batch"], step["seq_len"], step["steps"]) == ("tnn", 16, 1, 2, 32, 2)
    assert 0 < step["batch_ms"] < step["step_ms"] and step["data_share"] == pytest.approx(step["batch_ms"] / step["step_ms"])
    assert memory["text_gib"] == 0.001 and 0.99 * 2**30 / 1000 < memory["text_bytes"] <= 2**30 / 1000
    assert memory["shard_bytes"] > 2 * memory["text_bytes"] * 0.95 and memory["train_tokens"] > 0.8 * memory["text_bytes"]
    assert 100 * 2**20 < memory["peak_rss_bytes"] < 4 * 2**30 and memory["eval_tokens"] == 64 * 32 and memory["batch_ms"] > 0
    assert memory["generate_seconds"] > 0 and memory["prepare_seconds"] > 0
    assert len(parallel["peak_rss_each"]) == 2 and 100 * 2**20 < min(parallel["peak_rss_each"])  # each torchrun worker's own
    assert parallel["peak_rss_bytes"] == max(parallel["peak_rss_each"])
    assert all(r["git_commit"] and r["threads"] == 1 and r["load_average"] >= 0 for r in records)
    kept = sorted(path.name for path in folder.iterdir())
    assert kept == ["tokens-0.001g-v1"]  # the shards kept for the next run, the text gone
    printed = capsys.readouterr().out
    assert bench_tables(records) in printed
    assert all(column in printed for column in ("per_process_vs_encode_batch", "data_share", "peak_RSS_MiB", "vs_smallest"))


def test_the_tables_show_the_acceptance_ratios():
    base = {"tokenizer": "bpe:4096", "text_bytes": 2**20, "cpu_per_wall": 1.0}
    prepares = [
        {"kind": "data_prepare", "method": "encode_batch", "processes": 1, "seconds": 1.0, "mib_per_second": 4.0, **base},
        {"kind": "data_prepare", "method": "prepare", "processes": 2, "seconds": 0.5, "mib_per_second": 6.0, **base},
    ]
    memory = {
        "kind": "data_memory",
        "model": "tnn",
        "steps": 50,
        "train_tokens": 1,
        "train_seconds": 1.0,
        "batch_ms": 1.0,
        "batch_ms_max": 2.0,
        "prepare_seconds": None,  # the corpus was there
    }
    sizes = [{**memory, "text_gib": gib, "text_bytes": gib * 2**30, "shard_bytes": 2 * gib * 2**30} for gib in (16, 1)]
    sizes[0]["peak_rss_bytes"], sizes[1]["peak_rss_bytes"] = 1100 * 2**20, 1000 * 2**20
    sizes[0]["prepare_seconds"] = 512.0
    each = [900 * 2**20, 1200 * 2**20]  # two torchrun processes over 1 GiB: compared with each other, not with one process
    parallel = {**sizes[1], "processes": 2, "peak_rss_bytes": max(each), "peak_rss_each": each}
    records = [*prepares, *sizes, parallel]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in data_bench.data_tables(records).splitlines()]
    assert rows[0][-2:] == ["per_process_vs_encode_batch", "cpu_per_wall"] and rows[3][-2:] == ["0.75", "1"]  # 6 MiB/s by 2 against 4
    assert rows[-5][:2] == ["model", "processes"] and [row[1] for row in rows[-3:]] == ["1", "1", "2"]  # 1: records before --data-processes
    assert rows[-5][6:9] == ["peak_RSS_MiB", "least_RSS_MiB", "vs_smallest"]
    assert [row[6:9] for row in rows[-3:]] == [["1100", "1100", "1.1"], ["1000", "1000", "1"], ["1200", "900", "1"]]
    assert rows[-5][-1] == "prepared_MiB_s" and [row[-1] for row in rows[-3:]] == ["32", "-", "-"]  # 16 GiB in 512 s


def test_the_generated_text_is_deterministic_whole_documents():
    generator = WordText(0)
    text = generator.text(100_000)
    assert text == WordText(0).text(100_000) and text != generator.text(100_000, part=1)  # seeded by seed and part
    assert 90_000 < len(text) <= 100_000 and text.endswith(b"\n\n") and text.isascii()
    documents = text[:-2].split(b"\n\n")
    assert len(documents) > 20 and all(document and not document.startswith(b"\n") for document in documents)
    words = text.split()
    assert 2 <= sum(map(len, words)) / len(words) <= 8 and len(set(words)) < len(words) / 2  # word-like, and words recur


def test_a_written_corpus_is_reused_and_rewritten_when_changed(tmp_path):
    files = write_corpus(tmp_path, 50_000, file_bytes=20_000)
    assert len(files) == 3 and 49_000 < sum(path.stat().st_size for path in files) <= 50_000
    assert (
        corpus_files(tmp_path, 50_000) == files
        and corpus_files(tmp_path, 60_000) is None
        and corpus_files(tmp_path, 50_000, seed=1) is None
    )
    stamp = files[0].stat().st_mtime_ns
    assert write_corpus(tmp_path, 50_000, file_bytes=20_000) == files and files[0].stat().st_mtime_ns == stamp  # kept
    files[1].write_bytes(b"cut short")
    assert corpus_files(tmp_path, 50_000) is None
    assert write_corpus(tmp_path, 50_000, file_bytes=20_000) == files and files[1].stat().st_size > 9_000
    assert json.loads((tmp_path / MARKER).read_text())["size"] == 50_000


def test_the_peak_memory_is_the_childs_own(tmp_path):
    """A child that holds 300 MB, then one that holds little: the second's peak is its own, not the most of every
    child so far (``RUSAGE_CHILDREN``), nor this process's size, which Linux carries over an exec into ``ru_maxrss``.
    With ``depth=1``, the peaks of the processes a child starts (torchrun's workers), each its own."""
    script = "import sys, time; block = bytearray(int(sys.argv[1]) * 2**20); block[::4096] = b'x' * len(block[::4096]); time.sleep(0.3)"
    _, big = data_bench.child_peak_memory([sys.executable, "-c", script, "300"], tmp_path / "big.out")
    seconds, small = data_bench.child_peak_memory([sys.executable, "-c", script, "1"], tmp_path / "small.out")
    (big,), (small,) = big.values(), small.values()
    assert big > 300 * 2**20 > 100 * 2**20 > small > 0 and seconds > 0.3
    starts_two = (
        "import subprocess, sys; "
        f"children = [subprocess.Popen([sys.executable, '-c', {script!r}, size]) for size in ('200', '1')]; "
        "sys.exit(max(child.wait() for child in children))"
    )
    _, workers = data_bench.child_peak_memory([sys.executable, "-c", starts_two], tmp_path / "workers.out", depth=1, processes=2)
    assert len(workers) == 2 and 200 * 2**20 < max(workers.values()) < 300 * 2**20 and min(workers.values()) < 100 * 2**20
    with pytest.raises(RuntimeError, match="exited with status 3; its output ended:\nbye"):
        data_bench.child_peak_memory([sys.executable, "-c", "print('bye'); raise SystemExit(3)"], tmp_path / "fails.out")


def test_tokenizers_run_on_one_thread_inside_and_as_before_after(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    with data_bench.one_tokenizer_thread():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false" and os.environ["RAYON_NUM_THREADS"] == "1"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true" and "RAYON_NUM_THREADS" not in os.environ


def test_corpora_without_room_and_several_lengths_are_refused_before_anything_runs(tmp_path, capsys):
    folder = tmp_path / "corpora"
    message = usage_error(["bench", *TINY, "--data-gb", "1,1000000", "--data-dir", str(folder)], capsys)
    assert "--data-gb 1,1000000: the corpora need about 3050003.1 GiB free in --data-dir" in message and "GiB are" in message
    assert not folder.exists()
    assert "--kinds data trains at one length (--lengths), got [32, 64]" in usage_error(["bench", *TINY, "--lengths", "32,64"], capsys)
    assert "--data-gb: sizes in GiB must be positive" in usage_error(["bench", *TINY, "--data-gb", "1,0"], capsys)
    assert "--kinds data runs alone, not with ['mixer']" in usage_error(["bench", *TINY[:1], "data,mixer", *TINY[2:]], capsys)
