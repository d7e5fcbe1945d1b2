"""Reading corpora into documents: one small corpus written in every format the prepare command reads."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sys

import pytest

from tokenmix.data.documents import BadRecords, file_digest, find_source_files, hub_documents, parse_hub_source, read_documents

DOCS = ["Hello, world.", "Ünïcödé — 日本語 🙂", "first line\nsecond line", "  indented\ttabs  "]
# As text: the documents are paragraphs between blank lines (empty or whitespace only, one or more).
TEXT = "\ufeff" + DOCS[0] + "\n\n" + DOCS[1] + "\n \t\n\n" + DOCS[2] + "\r\n\n" + DOCS[3] + "\n\n\n"
JSONL = "\n".join([json.dumps({"text": DOCS[0], "id": 0}), "", json.dumps({"id": 1, "text": DOCS[1]}, ensure_ascii=False), "  "])
JSONL += "\n" + "\n".join(json.dumps({"text": doc}) for doc in DOCS[2:]) + "\n"
EXTRA = r'pip install "tokenmix\[prepare\]"'


def _zstd(data: bytes) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    middle = len(data) // 2  # two frames, as `cat a.zst b.zst` makes
    return zstandard.ZstdCompressor().compress(data[:middle]) + zstandard.ZstdCompressor().compress(data[middle:])


def _parquet(path, values, row_group_size=2, name="text"):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({name: pa.array(values, pa.string()), "id": list(range(len(values)))}), path, row_group_size=row_group_size)


def _arrow(path, values):
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"id": list(range(len(values))), "text": pa.array(values, pa.string())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)


WRITERS = {
    "corpus.txt": lambda path: path.write_bytes(TEXT.encode()),
    "corpus.txt.gz": lambda path: path.write_bytes(gzip.compress(TEXT.encode())),
    "corpus.md.zst": lambda path: path.write_bytes(_zstd(TEXT.encode())),
    "corpus.jsonl": lambda path: path.write_bytes(JSONL.encode()),
    "corpus.json.gz": lambda path: path.write_bytes(gzip.compress(JSONL.encode())),
    "corpus.jsonl.zstd": lambda path: path.write_bytes(_zstd(JSONL.encode())),
    "corpus.parquet": lambda path: _parquet(path, DOCS),
    "corpus.arrow": lambda path: _arrow(path, DOCS),
}


@pytest.mark.parametrize("name", WRITERS)
def test_every_format_gives_the_same_documents(tmp_path, name):
    WRITERS[name](tmp_path / name)
    (file,) = find_source_files(str(tmp_path / name))
    assert file.path == tmp_path / name and file.name == name
    assert list(read_documents(file, text_unit="paragraph")) == DOCS
    if file.format == "text":  # the whole file, less its byte order mark
        assert list(read_documents(file)) == [TEXT[1:]]
    if file.format == "parquet":
        import pyarrow.parquet as pq

        assert pq.ParquetFile(file.path).num_row_groups == 2


def test_text_units(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"a\r\nb  \r\n\r\n  \n c\n\n\n\xc3\xa9\td")
    (file,) = find_source_files(str(path))
    assert list(read_documents(file)) == ["a\r\nb  \r\n\r\n  \n c\n\n\n\u00e9\td"]
    assert list(read_documents(file, text_unit="paragraph")) == ["a\r\nb  ", " c", "\u00e9\td"]
    assert list(read_documents(file, text_unit="line")) == ["a", "b  ", " c", "\u00e9\td"]
    path.write_bytes(b" \n\n")
    assert [list(read_documents(file, text_unit=unit)) for unit in ("file", "paragraph", "line")] == [[], [], []]
    with pytest.raises(ValueError, match=r"text_unit must be one of \['file', 'paragraph', 'line'\], got 'page'"):
        read_documents(file, text_unit="page")


def test_folders_are_read_recursively_in_path_order_skipping_hidden_and_other_files(tmp_path):
    for name in ("b.txt", "a.txt", "a/z.jsonl", "a/y.md.gz", "a/x/w.parquet", "c.TXT", "d.text.zst"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    for name in (".hidden.txt", ".git/config.txt", "a/.cache/e.jsonl", "notes.csv", "f.txt.bz2", "g.parquet.gz", "README", "h.gz"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    files = find_source_files(str(tmp_path))
    assert [file.name for file in files] == ["a/x/w.parquet", "a/y.md.gz", "a/z.jsonl", "a.txt", "b.txt", "c.TXT", "d.text.zst"]
    assert [(file.format, file.compression) for file in files] == [
        ("parquet", None),
        ("text", "gzip"),
        ("jsonl", None),
        ("text", None),
        ("text", None),
        ("text", None),
        ("text", "zstd"),
    ]
    assert all(file.path == tmp_path / file.name for file in files)


def test_sources_that_cannot_be_read(tmp_path):
    with pytest.raises(ValueError, match=r"^source '.*nowhere' does not exist$"):
        find_source_files(str(tmp_path / "nowhere"))
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"^source '.*notes.csv': unknown suffix; files read: \.txt .* \.arrow$"):
        find_source_files(str(tmp_path / "notes.csv"))
    (tmp_path / ".hidden.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"^source '.*' holds no file that is read; files read: \.txt .*\.gz \.zst \.zstd.*\.parquet"):
        find_source_files(str(tmp_path))


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (b"not json", "not JSON: Expecting value at column 2"),
        (b"[1, 2]", "an array, not a JSON object"),
        (b'{"other": 1, "id": 2}', "no field 'text'; its fields: 'other', 'id'"),
        (b'{"text": 5}', "field 'text' is a number, not a string"),
        (b'{"text": null}', "field 'text' is null, not a string"),
        (b'{"text": "caf\xe9"}', "invalid UTF-8 at byte 14 of the line"),
    ],
)
def test_each_bad_jsonl_record_raises_with_its_line_or_is_skipped(tmp_path, line, what):
    path = tmp_path / "data" / "bad.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"text": "one"}\n\n ' + line + b'\n{"text": "two"}\n')
    (file,) = find_source_files(str(tmp_path))
    with pytest.raises(ValueError, match=f"^{re.escape(f'data/bad.jsonl:3: {what}')}$"):
        list(read_documents(file))
    bad = BadRecords(skip=True)
    assert list(read_documents(file, bad=bad)) == ["one", "two"]
    assert bad.count == 1 and bad.examples == [f"data/bad.jsonl:3: {what}"]


def test_a_json_file_holding_one_document_is_explained(tmp_path):
    (tmp_path / "a.json").write_text('{\n  "text": "x"\n}\n')
    (file,) = find_source_files(str(tmp_path / "a.json"))
    with pytest.raises(ValueError, match=r"^a.json:1: not JSON: .* \(a .json file is read as JSON Lines: one object per line\)$"):
        list(read_documents(file))


def test_invalid_utf8_is_a_bad_record_in_every_text_unit(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"good\n\nbad \xff here\nsame paragraph\n\nlast\n")
    (file,) = find_source_files(str(path))
    for unit, kept in (("file", []), ("paragraph", ["good", "last"]), ("line", ["good", "same paragraph", "last"])):
        with pytest.raises(ValueError, match=r"^a.txt:3: invalid UTF-8 at byte \d+ of the (line|file)$"):
            list(read_documents(file, text_unit=unit))
        bad = BadRecords(skip=True)
        assert list(read_documents(file, text_unit=unit, bad=bad)) == kept and bad.count == 1, unit
    with pytest.raises(ValueError, match=r"^a.txt:3: invalid UTF-8 at byte 10 of the file$"):
        list(read_documents(file))


def test_corrupt_compressed_files_are_errors_not_records(tmp_path):
    data = ("line %d\n" * 50 % tuple(range(50))).encode()
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(data)[:-12])
    (tmp_path / "cut.txt.zst").write_bytes(_zstd(data)[:-5])
    (tmp_path / "junk.txt.zst").write_bytes(b"not zstd at all")
    cases = (("cut.txt.gz", "gzip data: Compressed file ended"), ("cut.txt.zst", "zstd data: compressed file ended"), ("junk", "zstd data"))
    for name, what in cases:
        (file,) = [file for file in find_source_files(str(tmp_path)) if file.name.startswith(name)]
        for unit in ("file", "line"):
            with pytest.raises(ValueError, match=f"^{file.name}: unreadable {what}"):
                list(read_documents(file, text_unit=unit, bad=BadRecords(skip=True)))


def test_parquet_and_arrow_nulls_are_bad_rows_and_columns_are_checked(tmp_path):
    values = ["a", None, "b", "c", None]
    _parquet(tmp_path / "p.parquet", values)
    _arrow(tmp_path / "q.arrow", values)
    for file in find_source_files(str(tmp_path)):
        with pytest.raises(ValueError, match=f"^{file.name}:row 1: 'text' is null$"):
            list(read_documents(file))
        bad = BadRecords(skip=True)
        assert list(read_documents(file, bad=bad)) == ["a", "b", "c"]
        assert bad.examples == [f"{file.name}:row 1: 'text' is null", f"{file.name}:row 4: 'text' is null"]
        with pytest.raises(ValueError, match=f"^{file.name}: no column 'content'; its columns: ('text', 'id'|'id', 'text')$"):
            read_documents(file, field="content").__next__()
        with pytest.raises(ValueError, match=f"^{file.name}: column 'id' holds int64, not strings$"):
            read_documents(file, field="id").__next__()
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    (file,) = find_source_files(str(tmp_path / "broken.parquet"))
    with pytest.raises(ValueError, match="^broken.parquet: not a readable parquet file"):
        list(read_documents(file))


def test_missing_libraries_name_the_extra(tmp_path, monkeypatch):
    (tmp_path / "a.txt.zst").write_bytes(b"")
    (tmp_path / "b.parquet").write_bytes(b"")
    (tmp_path / "c.arrow").write_bytes(b"")
    for module in ("zstandard", "pyarrow", "pyarrow.parquet", "datasets"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    zst, parquet, arrow = find_source_files(str(tmp_path))
    with pytest.raises(ValueError, match=f"^a.txt.zst: reading zstd files needs zstandard: {EXTRA}$"):
        list(read_documents(zst))
    with pytest.raises(ValueError, match=f"^b.parquet: reading parquet files needs pyarrow: {EXTRA}$"):
        list(read_documents(parquet))
    with pytest.raises(ValueError, match=f"^c.arrow: reading arrow files needs pyarrow: {EXTRA}$"):
        list(read_documents(arrow))
    with pytest.raises(ValueError, match=f"^source 'hf:org/set': reading hf: datasets needs datasets: {EXTRA}$"):
        hub_documents("hf:org/set")


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    data = os.urandom((1 << 20) * 2 + 123)
    (tmp_path / "a.bin").write_bytes(data)
    assert file_digest(tmp_path / "a.bin") == hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError, match="is unreadable"):
        file_digest(tmp_path / "nothing")


def test_hub_specs():
    assert parse_hub_source("hf:org/set") == ("org/set", None, "train")
    assert parse_hub_source("hf:/data/repo:split=test:config=en") == ("/data/repo", "en", "test")
    for spec, match in (("hf:", "names no dataset"), ("hf:a:revision=x", "options after the name are config=VALUE and split=VALUE")):
        with pytest.raises(ValueError, match=match):
            parse_hub_source(spec)


# `datasets` takes a second or two to import: its tests share one module fixture.
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    with pytest.MonkeyPatch.context() as patch:  # its cache (lock files) in the test's folder; never the network
        patch.setenv("HF_HOME", str(root / "hf_home"))
        patch.setenv("HF_DATASETS_CACHE", str(root / "hf_home" / "datasets"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        datasets = pytest.importorskip("datasets", reason='the hf: and saved-dataset readers need: pip install "tokenmix[prepare]"')
        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"text": DOCS, "id": list(range(4))}).save_to_disk(str(root / "corpus" / "one"))
        splits = {"train": datasets.Dataset.from_dict({"text": DOCS[:3]}), "test": datasets.Dataset.from_dict({"text": DOCS[3:]})}
        datasets.DatasetDict(splits).save_to_disk(str(root / "two"), max_shard_size="1KB")
    (root / "corpus" / "notes.md").write_text(DOCS[0])
    repo = root / "repo"  # a dataset repository laid out as on the hub: a split per file
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "train.jsonl").write_text(JSONL)
    (repo / "data" / "test.jsonl").write_text(json.dumps({"text": DOCS[0]}) + "\n" + json.dumps({"text": None}) + "\n")
    return root


def test_saved_datasets_are_read_in_their_own_order(saved):
    files = find_source_files(str(saved / "corpus"))
    assert [file.name for file in files] == ["notes.md", "one/data-00000-of-00001.arrow"]
    assert [doc for file in files[1:] for doc in read_documents(file)] == DOCS
    files = find_source_files(str(saved / "two"))
    assert [file.name for file in files] == ["train/data-00000-of-00001.arrow", "test/data-00000-of-00001.arrow"]
    assert [doc for file in files for doc in read_documents(file)] == DOCS
    (file,) = find_source_files(str(saved / "corpus" / "one" / "data-00000-of-00001.arrow"))
    assert list(read_documents(file)) == DOCS


def test_hub_datasets_stream_their_field(saved):
    assert list(hub_documents(f"hf:{saved / 'repo'}")) == DOCS
    with pytest.raises(ValueError, match=f"^hf:{saved / 'repo'}:split=test:row 1: 'text' is null, not a string$"):
        list(hub_documents(f"hf:{saved / 'repo'}:split=test"))
    bad = BadRecords(skip=True)
    assert list(hub_documents(f"hf:{saved / 'repo'}:split=test", bad=bad)) == [DOCS[0]] and bad.count == 1
    with pytest.raises(ValueError, match="no column 'content'; its columns: 'text', 'id'"):
        hub_documents(f"hf:{saved / 'repo'}", field="content")
    with pytest.raises(ValueError, match=r"datasets.load_dataset failed: .*Couldn't find"):
        hub_documents(f"hf:{saved / 'nothing'}")
