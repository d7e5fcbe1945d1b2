"""ListOps (Nangia & Bowman 2018, arXiv 1804.06028) as the Long Range Arena generates it (Tay et al. 2020,
arXiv 2011.04006): embedded, no files needed; or the release's files.

An expression is a tree. A leaf is a digit 0-9; an operator node applies ``[MIN``, ``[MAX``, ``[MED``
(int of numpy's median: the floor of the mean of the two middle values for an even count) or ``[SM``
(sum mod 10) to its arguments and is closed by ``]``. The label, one of 10 classes, is the value.

Generation, as LRA's: a node at depth d (the root at 1) below ``max_depth`` is an operator with
probability 0.25, otherwise a uniform digit; at ``max_depth`` always a digit. An operator draws
randint(2, max_args) arguments (bounds inclusive), then its operator uniformly. The length counts
tokens without parentheses (a leaf 1, an operator 2 + its arguments' lengths); trees with
min_length < length < max_length (strict) are kept, each tree once (no duplicate within or across
splits). Official: 500 < length < 2000, max_depth 10, max_args 10, 96,000 / 2,000 / 2,000 trees.
Drawing stops as soon as a tree reaches ``max_length`` tokens: it would be rejected anyway, so the
kept trees have the same distribution, and deep settings do not draw huge trees in full.

Text form, the release's nested binary pairs: an operator with n arguments reads n + 1 ``(``, the
operator, each argument followed by ``)``, then ``] )``; MAX(2, 9) is ``( ( ( [MAX 2 ) 9 ) ] )``.
Release files ``basic_{train,val,test}.tsv`` hold a header ``Source<TAB>Target`` and one expression
and its value per line.

Tokens: digits are ids 0-9, ``[MIN [MAX [MED [SM`` are 10-13 and ``]`` is 14 (vocabulary 15);
parentheses are dropped. ``]`` stays: without it the prefix form cannot tell where an operator's
arguments end, and the task is not solvable.

Splits of the generated task: distinct trees in the order drawn, the test set first, then val, then
train, so a smaller ``train=`` count keeps the same validation and test sets. A generated task is
cached on disk (``cache.py``), keyed by the seed, the counts, the options and ``GENERATOR_VERSION``:
the official 100,000 trees take a minute to draw, and every evaluation of a run needs them again.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

import torch

from ..io.progress import progress_bar
from ..validation import check_int
from .cache import cache_directory, cache_key, load_examples, store_examples
from .corpus import SPLITS
from .examples import ClassificationData, Examples
from .release_files import Layout

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
WORDS = (*"0123456789", *OPERATORS, "]")  # the word of each token id
TOKEN_IDS = {word: token for token, word in enumerate(WORDS)}
FIRST_OPERATOR, END = 10, 14
VOCAB_SIZE, NUM_CLASSES = len(WORDS), 10
OPERATOR_PROBABILITY = 0.25  # LRA: a node is a leaf when random() > 0.25
TOKEN_DTYPE = torch.uint8
STALL_DRAWS = 1_000_000  # draws in a row without a new kept tree before the bounds are called too narrow
GENERATOR_VERSION = "1"  # bumped when the trees drawn for given options change (invalidates cached tasks)
RELEASE = Layout("listops", "the release's ListOps files listops-1000/basic_{train,val,test}.tsv", ("listops-1000", ""))


def _median(values: list[int]) -> int:
    ordered, half = sorted(values), len(values) // 2
    return ordered[half] if len(values) % 2 else (ordered[half - 1] + ordered[half]) // 2


APPLY = (min, max, _median, lambda values: sum(values) % 10)  # in the order of OPERATORS


@dataclass(frozen=True)
class ListOpsOptions:
    """Generation options; the defaults are the official ones. ``min_length`` defaults to
    ``max_length // 4`` (the official 500 for 2000)."""

    max_length: int = 2000
    min_length: int | None = None
    max_depth: int = 10
    max_args: int = 10

    def __post_init__(self):
        check_int(self.max_length, "listops max_length", minimum=2)
        if self.min_length is None:
            object.__setattr__(self, "min_length", self.max_length // 4)
        check_int(self.min_length, "listops min_length", minimum=0, maximum=self.max_length - 2)
        check_int(self.max_depth, "listops max_depth", minimum=1, maximum=200)  # the generator recurses per level
        check_int(self.max_args, "listops max_args", minimum=2)
        longest = 1  # the longest tree, built from the deepest level up (capped: only the comparison matters)
        for _ in range(self.max_depth - 1):
            longest = min(2 + self.max_args * longest, self.max_length)
        if longest <= self.min_length:
            raise ValueError(
                f"listops: min_length={self.min_length} keeps no tree: at max_depth={self.max_depth} and "
                f"max_args={self.max_args} the longest has {longest} tokens"
            )


class _TooLong(Exception):
    """The tree being drawn reached max_length tokens: it would be rejected."""


def draw_expression(rng: random.Random, options: ListOpsOptions) -> tuple[bytearray, int] | None:
    """One tree drawn by the generation rule, as (tokens, value); None once it reaches ``max_length`` tokens."""
    tokens = bytearray()
    uniform, randrange, max_depth, max_args, limit = rng.random, rng.randrange, options.max_depth, options.max_args, options.max_length

    def node(depth: int) -> int:
        if depth < max_depth and uniform() <= OPERATOR_PROBABILITY:
            at = len(tokens)
            tokens.append(0)  # the operator, drawn after its arguments
            values = []
            for _ in range(randrange(2, max_args + 1)):
                values.append(node(depth + 1))
                if len(tokens) >= limit:
                    raise _TooLong
            operator = randrange(len(OPERATORS))
            tokens[at] = FIRST_OPERATOR + operator
            tokens.append(END)
            return APPLY[operator](values)
        value = randrange(10)
        tokens.append(value)
        return value

    try:
        return tokens, node(1)
    except _TooLong:
        return None


def distinct_expressions(count: int, seed: int, options: ListOpsOptions) -> list[tuple[bytes, int]]:
    """``count`` distinct kept trees as (tokens, value), in the order drawn from ``random.Random(seed)``."""
    check_int(count, "listops count", minimum=0)
    rng, kept, misses = random.Random(seed), {}, 0
    with progress_bar(total=count, desc="listops", unit="tree") as bar:
        while len(kept) < count:
            drawn = draw_expression(rng, options)
            key = bytes(drawn[0]) if drawn is not None and options.min_length < len(drawn[0]) < options.max_length else None
            if key is None or key in kept:
                misses += 1
                if misses == STALL_DRAWS:
                    raise ValueError(f"listops: {STALL_DRAWS:,} draws in a row gave no new tree after {len(kept):,}; widen {options}")
                continue
            kept[key], misses = drawn[1], 0
            bar.update()
    return list(kept.items())


def expression_text(tokens) -> str:
    """The release's text form of the tree given by its tokens (see the module docstring)."""
    words, open_operators = [], []  # per open operator: [index of its "(" word, arguments so far]
    for token in tokens:
        if FIRST_OPERATOR <= token < END:
            open_operators.append([len(words), 0])
            words += ["", WORDS[token]]
            continue
        if token == END:
            at, arguments = open_operators.pop()
            words[at] = " ".join("(" * (arguments + 1))
            words += ["]", ")"]
        else:
            words.append(WORDS[token])
        if open_operators:
            open_operators[-1][1] += 1
            words.append(")")
    return " ".join(words)


def expression_tokens(text: str) -> bytes:
    """Token ids of a text-form expression, parentheses dropped; ValueError for an unknown word."""
    try:
        return bytes([TOKEN_IDS[word] for word in text.replace("(", " ").replace(")", " ").split()])
    except KeyError as error:
        raise ValueError(f"listops: unknown word {error.args[0]!r}; expected digits, {', '.join(OPERATORS)}, ], ( and )") from None


@dataclass
class TreeShape:
    """Node counts by depth (index 0: the root's depth, 1) and every operator's argument count."""

    leaves: list[int]
    operators: list[int]
    arities: list[int]

    @property
    def depth(self) -> int:
        return len(self.leaves)  # the deepest node is a leaf


def expression_shape(tokens) -> TreeShape:
    """The shape of the tree given by its tokens."""
    open_arguments, shape = [], TreeShape([], [], [])
    for token in tokens:
        if token == END:
            shape.arities.append(open_arguments.pop())
        else:
            level = len(open_arguments)
            for counts in (shape.leaves, shape.operators):
                counts.extend([0] * (level + 1 - len(counts)))
            if FIRST_OPERATOR <= token:
                shape.operators[level] += 1
                open_arguments.append(0)
                continue
            shape.leaves[level] += 1
        if open_arguments:
            open_arguments[-1] += 1
    return shape


def listops_examples(count: int, seed: int = 0, **options) -> list[tuple[str, int]]:
    """``count`` distinct generated (expression text, label) pairs; ``options`` are those of ``ListOpsOptions``
    (max_length, min_length, max_depth, max_args), official by default."""
    return [(expression_text(tokens), value) for tokens, value in distinct_expressions(count, seed, ListOpsOptions(**options))]


def generate_listops(seed: int = 0, train: int = 96_000, val: int = 2_000, test: int = 2_000, **options) -> ClassificationData:
    """The generated task: distinct trees from ``random.Random(seed)``, test first, then val, then train."""
    resolved = ListOpsOptions(**options)
    counts = {"test": test, "val": val, "train": train}
    for name, count in counts.items():
        check_int(count, f"listops {name}", minimum=1)
    described = {**{name: counts[name] for name in SPLITS}, **asdict(resolved)}
    path = cache_directory() / "listops" / f"{cache_key(GENERATOR_VERSION, json.dumps({'seed': seed, **described}, sort_keys=True))}.npz"
    splits = load_examples(path, SPLITS)
    if splits is None:
        drawn, splits, start = distinct_expressions(sum(counts.values()), seed, resolved), {}, 0
        for name, count in counts.items():
            part = drawn[start : start + count]
            splits[name] = Examples.from_sequences([tokens for tokens, _ in part], [value for _, value in part], dtype=TOKEN_DTYPE)
            start += count
        store_examples(path, splits)
    source = "listops:" + ":".join(f"{key}={value}" for key, value in described.items())
    return ClassificationData(source, VOCAB_SIZE, NUM_CLASSES, **splits)


def _one_tree(tokens: bytes) -> bool:
    """Whether ``tokens`` could be one tree: a digit alone, or an operator first and as many ``]`` as
    operators (counted at C speed; releases hold 10^5 expressions of 10^3 tokens)."""
    if len(tokens) == 1:
        return tokens[0] < FIRST_OPERATOR
    operators = sum(tokens.count(bytes([token])) for token in range(FIRST_OPERATOR, END))
    return bool(tokens) and FIRST_OPERATOR <= tokens[0] < END and operators == tokens.count(END)


def _read_split(path) -> Examples:
    try:
        return _read_rows(path)
    except UnicodeDecodeError as error:
        raise ValueError(f"listops: {path} is not UTF-8 text ({error.reason})") from None


def _read_rows(path) -> Examples:
    sequences, labels = [], []
    with RELEASE.open(path, "r", encoding="utf-8", newline="") as file:
        header = file.readline().rstrip("\r\n")
        if header != "Source\tTarget":
            raise ValueError(f"listops: {path} starts with {header[:40]!r}, not the release's header 'Source<TAB>Target'")
        for number, line in enumerate(progress_bar(file, desc=path.name, unit="line"), start=2):
            fields = line.rstrip("\r\n").split("\t")
            try:
                if len(fields) != 2 or fields[1] not in WORDS[:NUM_CLASSES]:
                    raise ValueError(f"expected 'expression<TAB>digit', got {line[:60]!r}")
                tokens = expression_tokens(fields[0])
                if not _one_tree(tokens):
                    raise ValueError(f"{fields[0][:60]!r} is not one expression (a digit, or operators each closed by ])")
                sequences.append(tokens)
            except ValueError as error:
                raise ValueError(f"listops: {path} line {number}: {error}") from None
            labels.append(int(fields[1]))
    if not labels:
        raise ValueError(f"listops: {path} holds no examples")
    return Examples.from_sequences(sequences, labels, dtype=TOKEN_DTYPE)


def read_listops(directory) -> ClassificationData:
    """The release's files: ``DIR/listops-1000/basic_{train,val,test}.tsv`` (or DIR holding them)."""
    root = RELEASE.root(directory, "basic_train.tsv")
    splits = {name: _read_split(RELEASE.require(root, f"basic_{name}.tsv")) for name in SPLITS}
    return ClassificationData(f"listops:{directory}", VOCAB_SIZE, NUM_CLASSES, **splits)


def load_listops(directory=None, *, seed: int = 0, **options) -> ClassificationData:
    """``read_listops(directory)`` when a directory is given, else ``generate_listops(seed, **options)``."""
    if directory is None:
        return generate_listops(seed, **options)
    if options:
        raise ValueError(
            f"listops:DIR reads the release's files; options {sorted(options)} apply to the generated task (listops:key=value...)"
        )
    return read_listops(directory)
