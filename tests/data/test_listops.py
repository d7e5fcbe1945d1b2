"""ListOps: the generator against independent readings of its text form, its distributions against the
generation rules, the release's file format, and the tokens models see."""

import csv
import random

import numpy as np
import pytest
import torch

from tokenmix.cli.plots import plot_listops_distributions
from tokenmix.data import listops as listops_module
from tokenmix.data import listops_examples, load_data, load_listops
from tokenmix.data.listops import (
    END,
    ListOpsOptions,
    distinct_expressions,
    draw_expression,
    expression_shape,
    expression_text,
    expression_tokens,
)

MAX, MIN, MED, SM = 11, 10, 12, 13


def _apply(operator: str, values: list[int]) -> int:
    """The operators as the spec states them, numpy's median included."""
    if operator == "[MAX":
        return max(values)
    if operator == "[MIN":
        return min(values)
    if operator == "[MED":
        return int(np.median(values))
    assert operator == "[SM"
    return sum(values) % 10


def _binary_pairs(words: list[str], at: int = 0):
    """Parse ``( A B )`` pairs into nested 2-tuples (the release's own tree), returning (tree, next index)."""
    if words[at] != "(":
        return words[at], at + 1
    left, at = _binary_pairs(words, at + 1)
    right, at = _binary_pairs(words, at)
    assert words[at] == ")", f"pair not closed at word {at}"
    return (left, right), at + 1


def _pairs_text(tree) -> str:
    return tree if isinstance(tree, str) else f"( {_pairs_text(tree[0])} {_pairs_text(tree[1])} )"


def _pairs_value(tree):
    """Evaluate a binary-pair tree: an operator word starts a function, arguments join it, ``]`` applies it."""
    if isinstance(tree, str):
        return int(tree) if tree.isdigit() else tree
    left, right = _pairs_value(tree[0]), _pairs_value(tree[1])
    if isinstance(left, str):  # an operator word meets its first argument
        return (left, [right])
    if right == "]":
        return _apply(*left)
    return (left[0], left[1] + [right])


def _stack_value(tokens: bytes) -> int:
    """Evaluate token ids with a stack: push operators and values, and at ``]`` pop back to the operator."""
    names, stack = {MAX: "[MAX", MIN: "[MIN", MED: "[MED", SM: "[SM"}, []
    for token in tokens:
        if token == END:
            values = []
            while not isinstance(stack[-1], str):
                values.append(stack.pop())
            stack.append(_apply(stack.pop(), values[::-1]))
        else:
            stack.append(names.get(token, token))
    (value,) = stack
    return value


def test_text_form_is_the_release_nesting_of_binary_pairs():
    assert expression_text(bytes([MAX, 2, 9, END])) == "( ( ( [MAX 2 ) 9 ) ] )"
    nested = bytes([MAX, MIN, 1, 2, END, 3, END])
    assert expression_text(nested) == "( ( ( [MAX ( ( ( [MIN 1 ) 2 ) ] ) ) 3 ) ] )"
    assert expression_tokens("( ( ( [MAX ( ( ( [MIN 1 ) 2 ) ] ) ) 3 ) ] )") == nested
    assert expression_text(bytes([7])) == "7"
    with pytest.raises(ValueError, match="unknown word 'MAX'"):
        expression_tokens("( ( MAX 1 ) ] )")


def test_labels_agree_with_two_independent_evaluators_on_2000_expressions():
    """2000 distinct expressions of up to 64 tokens and depth 6, each of the ten labels among them."""
    examples = listops_examples(2000, seed=3, max_length=64, max_depth=6)
    for text, label in examples:
        words = text.split()
        tree, end = _binary_pairs(words)
        assert end == len(words) and _pairs_text(tree) == text
        assert _pairs_value(tree) == label == _stack_value(expression_tokens(text))
    assert len({label for _, label in examples}) == 10


def test_official_expressions_agree_with_the_evaluators():
    for text, label in listops_examples(200, seed=5):
        tokens = expression_tokens(text)
        assert 500 < len(tokens) < 2000
        assert _pairs_value(_binary_pairs(text.split())[0]) == label == _stack_value(tokens)


def test_lengths_are_strictly_within_the_bounds_where_the_bounds_are_common():
    options = ListOpsOptions(min_length=4, max_length=12, max_depth=3, max_args=4)
    lengths = [len(tokens) for tokens, _ in distinct_expressions(1000, 0, options)]
    assert min(lengths) == 5 and max(lengths) == 11  # 4 and 12 are drawn often, and refused
    assert ListOpsOptions(max_length=512).min_length == 128 and ListOpsOptions().min_length == 500


def test_splits_are_distinct_seeded_and_keep_val_and_test_when_train_shrinks():
    data = load_data("listops:max_length=60:train=400:val=50:test=50", 0, seed=1)
    assert (data.vocab_size, data.num_classes, data.documents) == (15, 10, 1)
    assert (len(data.train), len(data.val), len(data.test)) == (400, 50, 50)
    assert int(data.train.tokens.max()) < 15
    seen = [bytes(split.sequence(i).tolist()) for split in (data.train, data.val, data.test) for i in range(len(split))]
    assert len(set(seen)) == len(seen)
    again = load_data("listops:max_length=60:train=400:val=50:test=50", 0, seed=1)
    assert all(getattr(data, s).tokens.equal(getattr(again, s).tokens) for s in ("train", "val", "test"))
    other = load_data("listops:max_length=60:train=400:val=50:test=50", 0, seed=2)
    assert not data.test.tokens[:100].equal(other.test.tokens[:100])
    smaller = load_data("listops:max_length=60:train=100:val=50:test=50", 0, seed=1)
    assert smaller.test.tokens.equal(data.test.tokens) and smaller.val.tokens.equal(data.val.tokens)
    assert data.source == "listops:train=400:val=50:test=50:max_length=60:min_length=15:max_depth=10:max_args=10"


def test_tokens_keep_the_closing_bracket_and_drop_parentheses():
    ((text, _),) = listops_examples(1, seed=0, max_length=40)
    tokens = expression_tokens(text)
    words = text.split()
    assert len(tokens) == len(words) - words.count("(") - words.count(")")
    assert tokens.count(END) == words.count("]") > 0


def _raw_draws(count: int, seed: int, **options) -> list[bytearray]:
    rng, resolved = random.Random(seed), ListOpsOptions(**options)
    return [draw_expression(rng, resolved)[0] for _ in range(count)]


def test_raw_draws_follow_the_generation_rules():
    """Before the length filter: the root is an operator with probability 0.25, argument counts are uniform
    on 2..max_args, operators and digits uniform, nothing below max_depth."""
    draws = _raw_draws(20_000, 0, min_length=0, max_length=10**9, max_depth=6, max_args=7)
    roots = np.array([tokens[0] >= 10 for tokens in draws])
    assert abs(roots.mean() - 0.25) < 0.015
    shapes = [expression_shape(tokens) for tokens in draws]
    assert max(shape.depth for shape in shapes) == 6 and sum(shape.operators[-1] for shape in shapes if shape.depth == 6) == 0
    below = [(sum(s.operators[d] for s in shapes if s.depth > d), sum(s.leaves[d] for s in shapes if s.depth > d)) for d in range(5)]
    assert all(abs(ops / (ops + leaves) - 0.25) < 0.02 for ops, leaves in below)
    arities = np.bincount([a for shape in shapes for a in shape.arities], minlength=8)[2:]
    assert arities.sum() > 10_000 and np.abs(arities / arities.sum() - 1 / 6).max() < 0.01
    tokens = np.frombuffer(b"".join(draws), dtype=np.uint8)
    operators = np.bincount(tokens[(tokens >= 10) & (tokens < END)] - 10, minlength=4)
    digits = np.bincount(tokens[tokens < 10], minlength=10)
    assert np.abs(operators / operators.sum() - 0.25).max() < 0.01 and np.abs(digits / digits.sum() - 0.1).max() < 0.01


def _reference_lengths(count: int, seed: int) -> list[int]:
    """Kept lengths from a plain transcription of the generation rule: whole trees, filtered afterwards."""
    rng, lengths = random.Random(seed), []

    def length(depth):
        if depth < 10 and rng.random() <= 0.25:
            return 2 + sum(length(depth + 1) for _ in range(rng.randint(2, 10)))
        return 1

    while len(lengths) < count:
        drawn = length(1)
        if 500 < drawn < 2000:
            lengths.append(drawn)
    return lengths


def test_kept_lengths_match_a_reference_sampler_that_draws_whole_trees():
    """Stopping a draw at max_length keeps the distribution: two-sample Kolmogorov-Smirnov at 1000 each."""
    ours = np.sort([len(tokens) for tokens, _ in distinct_expressions(1000, 11, ListOpsOptions())])
    reference = np.sort(_reference_lengths(1000, 12))
    grid = np.union1d(ours, reference)
    distance = np.abs(np.searchsorted(ours, grid, side="right") - np.searchsorted(reference, grid, side="right")).max() / 1000
    assert distance < 1.95 * np.sqrt(2 / 1000)  # the 0.1 % critical value


def test_kept_argument_counts_stay_near_uniform():
    shapes = [expression_shape(tokens) for tokens, _ in distinct_expressions(300, 4, ListOpsOptions())]
    arities = np.bincount([a for shape in shapes for a in shape.arities], minlength=11)[2:]
    assert np.abs(arities / arities.sum() - 1 / 9).max() < 0.006
    assert all(shape.depth == 10 for shape in shapes)  # official trees are deep


def test_release_files_are_read(tmp_path):
    folder = tmp_path / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    rows = {split: listops_examples(n, seed=i, max_length=50) for i, (split, n) in enumerate({"train": 30, "val": 5, "test": 6}.items())}
    for split, pairs in rows.items():
        with open(folder / f"basic_{split}.tsv", "w", newline="") as file:  # as the release's writer: csv, tab, CRLF
            writer = csv.writer(file, delimiter="\t")
            writer.writerow(["Source", "Target"])
            writer.writerows(pairs)
    assert (folder / "basic_val.tsv").read_bytes().startswith(b"Source\tTarget\r\n")
    for directory in (folder, folder.parent):
        data = load_data(f"listops:{directory}", 0)
        assert (len(data.train), len(data.val), len(data.test), data.vocab_size) == (30, 5, 6, 15)
        for k, (text, label) in enumerate(rows["test"]):
            assert bytes(data.test.sequence(k).tolist()) == expression_tokens(text) and int(data.test.labels[k]) == label
    with pytest.raises(ValueError, match="options"):
        load_listops(str(folder), max_length=100)
    (folder / "basic_val.tsv").write_text("Source\tTarget\r\n( ( [MAX 1 ) 2 ) ] )\t12\r\n")
    with pytest.raises(ValueError, match=r"basic_val.tsv line 2"):
        load_data(f"listops:{folder}", 0)
    (folder / "basic_val.tsv").write_text("Text\tLabel\r\n")
    with pytest.raises(ValueError, match="header"):
        load_data(f"listops:{folder}", 0)
    (folder / "basic_val.tsv").unlink()
    with pytest.raises(ValueError, match=r"basic_val.tsv is missing; expected the release's ListOps files"):
        load_data(f"listops:{folder.parent}", 0)


def test_bad_options_are_refused_before_generating(monkeypatch):
    for source, message in [
        ("listops:depth=3", r"unknown options \['depth'\]; accepted: \['train'"),
        ("listops:max_length=many", "max_length='many' must be an integer"),
        ("listops:min_length=600:max_length=500", "min_length must be an integer in"),
        ("listops:max_args=1", "max_args must be an integer >= 2"),
        ("listops:max_depth=2", "keeps no tree"),
        ("listops:train=0", "listops train must be an integer >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_data(source, 0)
    monkeypatch.setattr(listops_module, "STALL_DRAWS", 20_000)
    with pytest.raises(ValueError, match="gave no new tree after 400"):  # 4 operators x 10 x 10 digits: 400 trees of length 4
        listops_examples(401, min_length=3, max_length=5, max_depth=2, max_args=2)


def test_distribution_figure_is_written(tmp_path):
    path = plot_listops_distributions(tmp_path / "listops.png", count=50, max_length=64)
    assert path.exists() and path.stat().st_size > 1000


def test_a_generated_task_is_cached_by_its_parameters(tmp_path, monkeypatch):
    """Fails if the cache is not read (the second call would draw again) or not keyed by the seed and options."""
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path))
    options = dict(train=30, val=5, test=5, max_length=60, min_length=5)
    first = listops_module.generate_listops(seed=3, **options)
    (entry,) = (tmp_path / "listops").iterdir()
    drawn = listops_module.distinct_expressions
    monkeypatch.setattr(listops_module, "distinct_expressions", lambda *a: pytest.fail("drew again instead of reading the cache"))
    again = listops_module.generate_listops(seed=3, **options)
    for name in ("train", "val", "test"):
        assert torch.equal(first.split(name).tokens, again.split(name).tokens)
        assert torch.equal(first.split(name).labels, again.split(name).labels)
    monkeypatch.setattr(listops_module, "distinct_expressions", drawn)
    assert not torch.equal(listops_module.generate_listops(seed=4, **options).test.tokens, first.test.tokens)
    entry.write_bytes(b"damaged")  # made again
    assert torch.equal(listops_module.generate_listops(seed=3, **options).train.tokens, first.train.tokens)
