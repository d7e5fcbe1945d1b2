"""GLUE TSV reading: fixtures written in the release layout of every task."""

from __future__ import annotations

import warnings

import pytest
import torch

from tokenmix.data.glue import GLUE_TASKS, GlueData, load_glue

# Release layouts; every file also carries a sentence with literal double quotes.
FILES = {
    "SST-2": {
        "train.tsv": 'sentence\tlabel\nhide new secretions \t0\nthe "best" film ever \t1\n',
        "dev.tsv": "sentence\tlabel\nit 's a charming journey . \t1\n",
    },
    "CoLA": {
        "train.tsv": 'gj04\t1\t\tOur friends won\'t buy this analysis.\ngj04\t0\t*\tThey drank the pub "dry".\n',
        "dev.tsv": "gj04\t0\t*\tThe more we study verbs.\n",
    },
    "MRPC": {
        "train.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t702876\t702977\tAmrozi accused his "brother".\tReferring to him as "the witness".\n'
        "0\t2108705\t2108831\tYucaipa owned Dominick 's.\tYucaipa bought Dominick 's.\n",
        "dev.tsv": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said.\tHe stated.\n",
    },
    "QQP": {
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        '0\t1\t2\tWhat is "AI"?\tWhat does AI mean?\t1\n'
        "1\t3\t4\tHow old?\n"  # a broken row of the release: a question split across lines
        "2\t5\t6\tWhy?\tHow?\t0\n",
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t8\t9\tA?\tB?\t0\n",
    },
    "STS-B": {
        "train.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        '0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is "taking off".\tAn air plane is taking off.\t5.000\n'
        "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays.\tA woman sings.\t0.5\n",
        "dev.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man.\tA man.\t3.8\n",
    },
    "MNLI": {
        # train: label1 then gold_label; dev: label1..label5 then gold_label; parses before the sentences.
        "train.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        '0\t31193\t31193n\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tConceptually "cream" skimming.\tProduct and geography.\t'
        "neutral\tneutral\n"
        "1\t101457\t101457e\ttelephone\t( c )\t( d )\t(ROOT c)\t(ROOT d)\tyou know.\tYou lose.\tentailment\tentailment\n",
        "dev_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
        "0\t63735\t63735n\tslate\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tThe new rights.\tEveryone loves.\t"
        "neutral\tentailment\tneutral\tneutral\tneutral\tcontradiction\n",
        "dev_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
        "0\t75290\t75290c\tletters\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tYour gift.\tHundreds.\t"
        "contradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tentailment\n",
    },
    "QNLI": {
        "train.tsv": 'index\tquestion\tsentence\tlabel\n0\tWhat "came" first?\tThe chicken.\tnot_entailment\n1\tWho?\tHim.\tentailment\n',
        "dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhen?\tNow.\tentailment\n",
    },
    "RTE": {
        "train.tsv": 'index\tsentence1\tsentence2\tlabel\n0\tNo "weapons" found.\tWeapons found.\tnot_entailment\n'
        "1\tA dog ran.\tAn animal ran.\tentailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\r\n0\tDana won.\tDana lost.\tnot_entailment\r\n",
    },
}
FOLDERS = dict(zip(GLUE_TASKS, ("CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE"), strict=True))


@pytest.fixture
def glue(tmp_path):
    for folder, files in FILES.items():
        (tmp_path / folder).mkdir()
        for name, text in files.items():
            (tmp_path / folder / name).write_text(text, encoding="utf-8", newline="")
    return tmp_path


def _load(task, directory) -> GlueData:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_glue(task, directory)


def _check(split, first, second, labels):
    assert split.first == first
    assert split.second == second
    assert split.labels.dtype == (torch.float32 if labels and isinstance(labels[0], float) else torch.int64)
    assert split.labels.tolist() == pytest.approx(labels)
    assert len(split) == len(first)


def test_sst2(glue):
    data = _load("sst2", glue)
    assert data.task == "sst2" and data.label_names == ("negative", "positive") and list(data.splits) == ["train", "dev"]
    _check(data.splits["train"], ["hide new secretions ", 'the "best" film ever '], None, [0, 1])
    _check(data.splits["dev"], ["it 's a charming journey . "], None, [1])


def test_cola_has_no_header(glue):
    data = _load("cola", glue)
    assert data.label_names == ("unacceptable", "acceptable")
    _check(data.splits["train"], ["Our friends won't buy this analysis.", 'They drank the pub "dry".'], None, [1, 0])
    _check(data.splits["dev"], ["The more we study verbs."], None, [0])


def test_mrpc_pairs_and_byte_order_mark(glue):
    data = _load("mrpc", glue)
    assert data.label_names == ("not_equivalent", "equivalent")
    _check(
        data.splits["train"],
        ['Amrozi accused his "brother".', "Yucaipa owned Dominick 's."],
        ['Referring to him as "the witness".', "Yucaipa bought Dominick 's."],
        [1, 0],
    )
    _check(data.splits["dev"], ["He said."], ["He stated."], [1])


def test_qqp_skips_broken_rows_with_a_warning(glue):
    with pytest.warns(UserWarning, match=r"skipped 1 rows.*train\.tsv|train\.tsv.*skipped 1 rows"):
        data = load_glue("qqp", glue)
    assert data.label_names == ("not_duplicate", "duplicate")
    _check(data.splits["train"], ['What is "AI"?', "Why?"], ["What does AI mean?", "How?"], [1, 0])
    _check(data.splits["dev"], ["A?"], ["B?"], [0])


@pytest.mark.filterwarnings("ignore:glue qqp")
def test_qqp_row_with_too_many_fields_is_an_error(glue):
    (glue / "QQP" / "dev.tsv").write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t8\t9\tA?\tB?\t0\textra\n")
    with pytest.raises(ValueError, match=r"dev\.tsv line 2: 7 tab-separated fields, expected 6"):
        load_glue("qqp", glue)


def test_stsb_float_scores(glue):
    data = _load("stsb", glue)
    assert data.label_names is None
    _check(
        data.splits["train"], ['A plane is "taking off".', "A man plays."], ["An air plane is taking off.", "A woman sings."], [5.0, 0.5]
    )
    _check(data.splits["dev"], ["A man."], ["A man."], [3.8])


def test_mnli_gold_label_and_two_dev_files(glue):
    data = _load("mnli", glue)
    assert data.label_names == ("entailment", "neutral", "contradiction")
    assert list(data.splits) == ["train", "dev_matched", "dev_mismatched"]
    _check(data.splits["train"], ['Conceptually "cream" skimming.', "you know."], ["Product and geography.", "You lose."], [1, 0])
    # gold_label, not label1
    _check(data.splits["dev_matched"], ["The new rights."], ["Everyone loves."], [2])
    _check(data.splits["dev_mismatched"], ["Your gift."], ["Hundreds."], [0])


def test_qnli_and_rte(glue):
    qnli = _load("qnli", glue)
    assert qnli.label_names == ("entailment", "not_entailment")
    _check(qnli.splits["train"], ['What "came" first?', "Who?"], ["The chicken.", "Him."], [1, 0])
    _check(qnli.splits["dev"], ["When?"], ["Now."], [0])
    rte = _load("rte", glue)
    assert rte.label_names == ("entailment", "not_entailment")
    _check(rte.splits["train"], ['No "weapons" found.', "A dog ran."], ["Weapons found.", "An animal ran."], [1, 0])
    _check(rte.splits["dev"], ["Dana won."], ["Dana lost."], [1])  # CRLF line endings


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_directory_may_be_the_task_folder(glue, task):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_root, from_folder = load_glue(task, glue), load_glue(task, glue / FOLDERS[task])
    for name, split in from_root.splits.items():
        assert from_folder.splits[name].first == split.first
        assert torch.equal(from_folder.splits[name].labels, split.labels)


def test_unknown_task_lists_the_names(glue):
    with pytest.raises(ValueError, match="cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte"):
        load_glue("wnli", glue)


def test_missing_folder_and_file(glue, tmp_path):
    with pytest.raises(ValueError, match=r"SST-2/\{train\.tsv, dev\.tsv\}"):
        load_glue("sst2", tmp_path / "nowhere")
    (glue / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(ValueError, match=r"missing .*dev_mismatched\.tsv; expected header"):
        load_glue("mnli", glue)


def test_header_without_expected_column(glue):
    (glue / "RTE" / "dev.tsv").write_text("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(ValueError, match=r"dev\.tsv line 1: header lacks \['sentence1', 'sentence2'\].*expected header"):
        load_glue("rte", glue)


@pytest.mark.parametrize(
    ("folder", "task", "text", "match"),
    [
        ("SST-2", "sst2", "sentence\tlabel\ngood\t2\n", r"line 2: label '2' is not one of \['0', '1'\]"),
        ("CoLA", "cola", "gj04\t1\t\tfine.\ngj04\tyes\t\tbad.\n", r"line 2: label 'yes'"),
        ("CoLA", "cola", "gj04\t1\tfine.\n", r"line 1: 3 tab-separated fields, expected 4; expected no header"),
        ("STS-B", "stsb", "sentence1\tsentence2\tscore\na\tb\tfive\n", r"line 2: score 'five' is not a number from 0 to 5"),
        ("STS-B", "stsb", "sentence1\tsentence2\tscore\na\tb\tnan\n", r"line 2: score 'nan'"),
        ("MRPC", "mrpc", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tonly one string\n", r"line 2: 4 tab-separated"),
        ("QNLI", "qnli", "index\tquestion\tsentence\tlabel\n0\tq\ts\tneutral\n", r"label 'neutral'"),
        ("MNLI", "mnli", "sentence1\tsentence2\tgold_label\na\tb\t-\n", r"label '-'"),
        ("RTE", "rte", "", r"train\.tsv is empty"),
    ],
)
def test_malformed_files(glue, folder, task, text, match):
    (glue / folder / "train.tsv").write_text(text)
    with pytest.raises(ValueError, match=match) as error:
        load_glue(task, glue)
    assert "train.tsv" in str(error.value)
