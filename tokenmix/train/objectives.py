"""What a run learns from its data: batches, the loss and evaluation, one class per kind of data.

- ``LanguageModeling``: a text corpus in its tokenizer's ids, next-token (task "lm") or
  masked-token ("mlm") prediction, scored in bits per byte;
- ``Recall``: associative recall, trained on next tokens, scored on the recalled value;
- ``Classification``: one label per example (ListOps, the Long Range Arena tasks), task "classify";
- ``Glue``: a GLUE task, classified (or its score regressed: STS-B), scored by GLUE's metric.

``objective_for(data, task)`` picks the objective of a loaded ``--data`` source; ``check_task(source,
task)`` refuses a task the source cannot learn before it is loaded. The trainer and ``tokenmix eval``
only talk to the objective.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..data.batches import Part, document_lm_batch, document_mlm_batch, lm_batch, mlm_batch
from ..data.sources import source_kind
from .evaluate import EVAL_BATCH, evaluate_classification, evaluate_lm, evaluate_mlm, evaluate_recall, predict
from .metrics import binomial_tail, glue_metrics


def shard_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group=None) -> torch.Tensor:
    """The share of the batch's mean next-token loss that a shard's logits carry (context parallelism): their
    summed loss against the shard's ``targets`` over the count of the whole batch's scored tokens (targets -100:
    unscored), the counts of the shards of ``group`` added up (one all-reduce; None: this process's alone)."""
    scored = (targets != -100).sum()
    if group is not None:
        torch.distributed.all_reduce(scored, group=group)
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss / scored.clamp_min(1)


class Objective:
    """Batches of ``data`` for ``task``, their loss, and the evaluation of a split."""

    tasks: tuple[str, ...] = ()
    kind = ""  # what the error for a wrong task calls the data
    streams = False  # whether segment-recurrent models (Transformer-XL family) can learn it
    text = False  # whether its tokens are text a sample can be printed in
    reads_parts = False  # whether ``batch`` can read a part of each window alone (context parallelism), else whole examples

    def __init__(self, data, task: str, seed: int = 0):
        self.check_task(data.source, task)
        self.data, self.task, self.seed = data, task, seed

    @classmethod
    def check_task(cls, source: str, task: str) -> None:
        if task not in cls.tasks:
            choices = " or ".join(f"--task {name}" for name in cls.tasks)
            raise ValueError(f"data {source!r} is a {cls.kind} task: use {choices} (got task={task!r})")

    def model_fields(self) -> dict:
        """The model settings the data fixes (vocabulary; classes and documents for classification)."""
        return {"vocab_size": self.data.vocab_size}

    def batch(self, batch_size: int, seq_len: int, generator: torch.Generator, part: Part = None):
        """(inputs, targets, mask) of one training step; mask None when every token is real. ``part`` (start, stop),
        given where ``reads_parts``: inputs and targets of those positions of each window alone, the mask whole."""
        raise NotImplementedError  # pragma: no cover - abstract

    def largest_example(self, seq_len: int, part: Part = None):
        """(inputs, targets, mask) of one example as long as any the run draws (for the memory estimate)."""
        return self.batch(1, seq_len, torch.Generator().manual_seed(self.seed), part)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=-100)

    def shard_loss(self, logits: torch.Tensor, targets: torch.Tensor, shard) -> torch.Tensor:
        """This process's term of the batch's loss under context parallelism (``shard``: its ContextShard):
        the terms of the processes of a group add up to the loss. Here, the share its tokens carry (``targets``:
        the shard's where the objective reads parts, else the whole batch's)."""
        own = targets if self.reads_parts else targets[:, shard.start : shard.stop]
        return shard_cross_entropy(logits, own, shard.group)

    def evaluate(self, model, split: str, *, length: int, max_tokens: int | None = None, batch_size: int = EVAL_BATCH) -> dict:
        raise NotImplementedError  # pragma: no cover - abstract

    def evaluation_extent(self, split: str, max_tokens: int | None):
        """What ``evaluate(split, max_tokens=...)`` reads, comparable between calls: equal extents of one
        split read the same data, so the same weights give the same metrics."""
        return max_tokens


class LanguageModeling(Objective):
    tasks = ("lm", "mlm")
    streams = True
    text = True
    reads_parts = True
    kind = "language-modelling"

    def model_fields(self) -> dict:
        return {"vocab_size": self.data.tokenizer.model_vocab_size(self.task)}

    def batch(self, batch_size, seq_len, generator, part=None):
        """Random windows of the training split; with prepared data's ``windows=within``, each in one document;
        ``part``: of each only the positions [start, stop) are read (a prepared split reads no other ids)."""
        tokenizer, train = self.data.tokenizer, self.data.train
        within = self.data.windows == "within"
        pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0  # masked wherever it is padding
        if self.task == "mlm":
            masking = (tokenizer.mask_id, tokenizer.vocab_size)
            if within:
                return document_mlm_batch(train, batch_size, seq_len, generator, *masking, pad_id, part)
            return (*mlm_batch(train, batch_size, seq_len, generator, *masking, part), None)
        if within:
            return document_lm_batch(train, batch_size, seq_len, generator, pad_id, part)
        return (*lm_batch(train, batch_size, seq_len, generator, part), None)

    def evaluate(self, model, split, *, length, max_tokens=None, batch_size=EVAL_BATCH):
        """Loss, perplexity per token, bits per byte; for next-token prediction also the perplexity
        per whitespace-separated word of the text the predicted tokens spell."""
        data, tokenizer = self.data.split(split), self.data.tokenizer
        if self.task == "mlm":
            options = {"vocab_size": tokenizer.vocab_size, "byte_lengths": tokenizer.byte_lengths}
            return evaluate_mlm(model, data, length, tokenizer.mask_id, batch_size, max_tokens, self.seed, **options)
        metrics = evaluate_lm(model, data, length, batch_size, max_tokens, tokenizer.byte_lengths)
        words = len(tokenizer.decode(data[1 : 1 + metrics["tokens"]].tolist()).split())  # the targets, in order
        metrics["word_ppl"] = math.exp(min(metrics["loss"] * metrics["tokens"] / max(words, 1), 50.0))
        return {**metrics, "words": words}


class Recall(Objective):
    tasks = ("lm",)
    kind = "next-token"

    def batch(self, batch_size, seq_len, generator, part=None):
        return (*self.data.batch(batch_size, generator), None)

    def evaluate(self, model, split, *, length, max_tokens=None, batch_size=EVAL_BATCH):
        examples = None if max_tokens is None else max(1, max_tokens // self.data.length)
        return evaluate_recall(model, *self.data.split(split), batch_size, examples)


class Classification(Objective):
    """Batches of examples padded to a multiple of ``PAD_MULTIPLE`` tokens (images: their grid, exactly),
    so FFT sizes and length-dependent operators (FD-TNO's taps) recur from batch to batch."""

    tasks = ("classify",)
    kind = "classification"
    PAD_MULTIPLE = 64
    MIN_EXAMPLES = 256

    @property
    def multiple(self) -> int:
        return 1 if self.data.grid is not None else self.PAD_MULTIPLE

    def model_fields(self) -> dict:
        grid = {"grid": self.data.grid} if self.data.grid is not None else {}
        return {"vocab_size": self.data.vocab_size, "num_classes": self.data.num_classes, "documents": self.data.documents, **grid}

    def batch(self, batch_size, seq_len, generator, part=None):
        train = self.data.train
        tokens, mask, labels = train.batch(torch.randint(len(train), (batch_size,), generator=generator), multiple=self.multiple)
        return tokens, labels, None if bool(mask.all()) else mask

    def largest_example(self, seq_len, part=None):
        train = self.data.train
        longest = int(train.lengths().max(dim=1).values.argmax())
        tokens, mask, labels = train.batch([longest], multiple=self.multiple)
        return tokens, labels, mask

    def shard_loss(self, logits, targets, shard):
        """Every process of the group holds the whole batch's class logits (pooled over the shards): a 1/P part of its loss."""
        return self.loss(logits, targets) / shard.size

    def evaluate(self, model, split, *, length, max_tokens=None, batch_size=EVAL_BATCH):
        """Loss and accuracy over the split, with the majority-class accuracy beside them (the floor) and the
        one-sided exact binomial p-value of an accuracy that high from a classifier at that floor."""
        metrics = evaluate_classification(model, self.sample(split, max_tokens), batch_size, self.multiple)
        floor = self.data.majority_accuracy(split)
        correct = round(metrics["accuracy"] * metrics["examples"])
        return {**metrics, "majority_accuracy": floor, "p_above_majority": binomial_tail(correct, metrics["examples"], floor)}

    def sample(self, split: str, max_tokens: int | None):
        """The split, or with ``max_tokens`` (periodic validation) a fixed random sample of about that
        many tokens' worth of its examples, at least ``MIN_EXAMPLES``: long examples (Path-X) would
        otherwise leave a handful."""
        examples = self.data.split(split)
        if max_tokens is not None and len(examples):
            count = self.evaluation_extent(split, max_tokens)
            examples = examples.subset(torch.randperm(len(examples), generator=torch.Generator().manual_seed(self.seed))[:count])
        return examples

    def evaluation_extent(self, split, max_tokens):
        """The number of examples ``sample`` takes (the first ones of one fixed permutation)."""
        examples = self.data.split(split)
        if max_tokens is None or not len(examples):
            return len(examples)
        mean_length = max(1, examples.tokens.numel() // len(examples))
        return min(len(examples), max(self.MIN_EXAMPLES, max_tokens // mean_length))


class Glue(Classification):
    """A GLUE task: cross-entropy over classes, or the squared error of one score (STS-B, whose
    ``num_classes`` is 1); evaluated with the task's GLUE metric (``metrics.GLUE_METRICS``)."""

    kind = "GLUE"

    @property
    def regression(self) -> bool:
        return self.data.num_classes == 1

    def loss(self, logits, targets):
        if self.regression:
            return F.mse_loss(logits[:, 0].float(), targets.float())
        return super().loss(logits, targets)

    def evaluate(self, model, split, *, length, max_tokens=None, batch_size=EVAL_BATCH):
        outputs, labels = predict(model, self.sample(split, max_tokens), batch_size, self.multiple)
        predictions = outputs[:, 0] if self.regression else outputs.argmax(-1)
        loss = float(self.loss(outputs, labels)) if len(labels) else math.nan
        floor = {} if self.regression else {"majority_accuracy": self.data.majority_accuracy(split)}
        return {"loss": loss, **glue_metrics(self.data.glue_task, predictions, labels), "examples": len(labels), **floor}


def objective_class(source: str) -> type[Objective]:
    """The objective of a ``--data`` source, from its name (``tokenmix.data.sources.source_kind``)."""
    return {"corpus": LanguageModeling, "recall": Recall, "classification": Classification, "glue": Glue}[source_kind(source)]


def check_task(source: str, task: str) -> None:
    """ValueError unless ``task`` fits the data ``source`` names; reads no data."""
    objective_class(source).check_task(source, task)


def objective_for(data, task: str, seed: int = 0) -> Objective:
    """The objective of a loaded ``--data`` source (``tokenmix.data.load_data``) for ``task``."""
    return objective_class(data.source)(data, task, seed)
