"""GLUE metrics against values worked out by hand in the comments; the binomial tail against its exact rational sum."""

import math
from fractions import Fraction

import pytest
import torch

from tokenmix.train.metrics import (
    GLUE_METRICS,
    GLUE_TASKS,
    accuracy,
    binomial_tail,
    f1,
    glue_metrics,
    matthews_correlation,
    pearson,
    spearman,
)

# Confusion matrix TP=3, TN=2, FP=1, FN=1 (positions 0-2 TP, 3-4 TN, 5 FP, 6 FN).
PRED = torch.tensor([1, 1, 1, 0, 0, 1, 0])
GOLD = torch.tensor([1, 1, 1, 0, 0, 0, 1])
# Lopsided matrix TP=2, TN=1, FP=3, FN=1 (positions 0-1 TP, 2 TN, 3-5 FP, 6 FN): FP != FN.
PRED2 = torch.tensor([1, 1, 0, 1, 1, 1, 0])
GOLD2 = torch.tensor([1, 1, 0, 0, 0, 0, 1])


def test_accuracy_by_hand():
    # 5 of 7 agree (3 TP + 2 TN).
    assert accuracy(PRED, GOLD) == pytest.approx(5 / 7)
    # Multi-class (MNLI): [0,1,2,2] vs [0,1,1,2], 3 of 4 agree.
    assert accuracy(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])) == pytest.approx(0.75)
    # Shapes other than 1-D are flattened: 2 of 4 agree.
    assert accuracy(torch.tensor([[1, 0], [1, 1]]), torch.tensor([[1, 1], [0, 1]])) == pytest.approx(0.5)


def test_f1_by_hand():
    # precision = 3/(3+1), recall = 3/(3+1); F1 = 2*3/(2*3+1+1) = 6/8 = 0.75
    assert f1(PRED, GOLD) == pytest.approx(0.75)
    # precision = 2/(2+3) = 0.4, recall = 2/(2+1) = 2/3;
    # F1 = 2*0.4*(2/3)/(0.4+2/3) = 2*2/(2*2+3+1) = 4/8 = 0.5 (precision alone would give 0.4, recall 2/3)
    assert f1(PRED2, GOLD2) == pytest.approx(0.5)
    # The positive class is 1: swapping the classes gives TP=1, FP=1, FN=3 -> 2/(2+1+3) = 1/3.
    assert f1(1 - PRED2, 1 - GOLD2) == pytest.approx(1 / 3)


def test_f1_degenerate_cases_are_zero_or_one():
    # No positive predictions: TP=0, precision 0/0 -> defined as 0.0.
    assert f1(torch.tensor([0, 0, 0]), torch.tensor([0, 1, 1])) == 0.0
    # No positive labels: TP=0, recall 0/0 -> 0.0.
    assert f1(torch.tensor([1, 0, 0]), torch.tensor([0, 0, 0])) == 0.0
    # Neither: all correct, but no positives -> still 0.0 (while accuracy is 1.0).
    assert f1(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)) == 0.0
    # All one (positive) class, all correct: TP=4 -> 8/8 = 1.0.
    assert f1(torch.ones(4, dtype=torch.long), torch.ones(4, dtype=torch.long)) == 1.0


def test_matthews_by_hand():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3*2 - 1*1) / sqrt(4*4*3*3) = 5/12
    assert matthews_correlation(PRED, GOLD) == pytest.approx(5 / 12)
    # (2*1 - 3*1) / sqrt((2+3)(2+1)(1+3)(1+1)) = -1/sqrt(5*3*4*2) = -1/sqrt(120)
    assert matthews_correlation(PRED2, GOLD2) == pytest.approx(-1 / math.sqrt(120))
    # Perfect: TP=2, TN=2 -> 4/sqrt(2*2*2*2) = 1; all wrong: -4/4 = -1.
    y = torch.tensor([1, 0, 1, 0])
    assert matthews_correlation(y, y) == pytest.approx(1.0)
    assert matthews_correlation(1 - y, y) == pytest.approx(-1.0)


def test_matthews_is_zero_when_the_denominator_is():
    # All predictions one class: TP+FP = 0 -> 0.0.
    assert matthews_correlation(torch.zeros(4, dtype=torch.long), torch.tensor([1, 0, 1, 0])) == 0.0
    # All labels one class, even when every prediction is right: TN+FP = 0 -> 0.0.
    assert matthews_correlation(torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.long)) == 0.0


def test_binary_metrics_refuse_other_classes():
    with pytest.raises(ValueError, match=r"labels must contain only the binary classes \[0, 1\]"):
        f1(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"predictions must contain only the binary classes"):
        matthews_correlation(torch.tensor([0, 3, 1]), torch.tensor([0, 1, 1]))


def test_pearson_by_hand():
    # x = [1,2,3], y = [2,4,7]: dx = [-1,0,1], dy = [-7/3,-1/3,8/3]
    # sum dx*dy = 7/3 + 8/3 = 5; sum dx^2 = 2; sum dy^2 = (49+1+64)/9 = 114/9
    # r = 5 / sqrt(2*114/9) = 15/sqrt(228)
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])
    assert pearson(x, y) == pytest.approx(15 / math.sqrt(228))
    # Exact linear relations: +1 and -1.
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert pearson(x, -3 * x) == pytest.approx(-1.0)


def test_pearson_of_a_constant_is_zero():
    # A constant input has sum dx^2 = 0: the denominator is 0 -> defined as 0.0.
    assert pearson(torch.tensor([2.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) == 0.0
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([5.0, 5.0, 5.0])) == 0.0
    assert pearson(torch.tensor([4.0]), torch.tensor([1.0])) == 0.0


def test_spearman_with_ties_by_hand():
    # x = [10,20,20,30] ranks [1, 2.5, 2.5, 4] (the tie shares (2+3)/2); y = [1,3,2,4] ranks [1,3,2,4].
    # Both mean 2.5: dx = [-1.5,0,0,1.5], dy = [-1.5,0.5,-0.5,1.5]
    # sum dx*dy = 2.25 + 2.25 = 4.5; sum dx^2 = 4.5; sum dy^2 = 5 -> r = 4.5/sqrt(22.5) = 3/sqrt(10)
    # (ordinal ranks [1,2,3,4] for x would give 4/5 = 0.8 instead)
    x, y = torch.tensor([10.0, 20.0, 20.0, 30.0]), torch.tensor([1.0, 3.0, 2.0, 4.0])
    assert spearman(x, y) == pytest.approx(3 / math.sqrt(10))
    # The same pairs in another order give the same value.
    order = torch.tensor([3, 1, 0, 2])
    assert spearman(x[order], y[order]) == pytest.approx(3 / math.sqrt(10))
    # Ties on both sides: x = [1,1,2] ranks [1.5,1.5,3]; y = [5,6,6] ranks [1,2.5,2.5]; both mean 2.
    # dx = [-0.5,-0.5,1], dy = [-1,0.5,0.5]: sum dx*dy = 0.5 - 0.25 + 0.5 = 0.75; sums of squares 1.5 and 1.5
    # r = 0.75/1.5 = 0.5
    assert spearman(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([5.0, 6.0, 6.0])) == pytest.approx(0.5)


def test_spearman_sees_only_the_order():
    # y = x^3 is monotone: the ranks agree exactly, though Pearson is below 1.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert pearson(x, x**3) < 0.99
    assert spearman(x, -x) == pytest.approx(-1.0)
    # A constant input ranks all tied: constant ranks -> 0.0, as for Pearson.
    assert spearman(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])) == 0.0


def test_scores_must_be_finite():
    with pytest.raises(ValueError, match="targets must be finite"):
        pearson(torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("metric", [accuracy, f1, matthews_correlation, pearson, spearman])
def test_every_metric_refuses_mismatched_or_empty_inputs(metric):
    with pytest.raises(ValueError, match="must have the same shape"):
        metric(torch.tensor([1, 0, 1]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="must not be empty"):
        metric(torch.tensor([]), torch.tensor([]))


def test_the_glue_table():
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"}
    assert GLUE_METRICS["cola"] == ("matthews",)
    assert GLUE_METRICS["mrpc"] == GLUE_METRICS["qqp"] == ("f1", "accuracy")
    assert GLUE_METRICS["stsb"] == ("pearson", "spearman")
    for task in ("sst2", "mnli", "qnli", "rte"):
        assert GLUE_METRICS[task] == ("accuracy",)


@pytest.mark.parametrize(
    "task, expected",
    [
        ("cola", {"matthews": 5 / 12}),
        ("sst2", {"accuracy": 5 / 7}),
        ("mrpc", {"f1": 0.75, "accuracy": 5 / 7}),
        ("qqp", {"f1": 0.75, "accuracy": 5 / 7}),
        ("qnli", {"accuracy": 5 / 7}),
        ("rte", {"accuracy": 5 / 7}),
    ],
)
def test_glue_metrics_for_binary_tasks(task, expected):
    # The TP=3, TN=2, FP=1, FN=1 matrix from above.
    result = glue_metrics(task, PRED, GOLD)
    assert list(result) == list(expected)
    assert result == pytest.approx(expected)
    assert all(type(value) is float for value in result.values())


def test_glue_metrics_for_mnli_and_stsb():
    # MNLI, three classes: 3 of 4 agree.
    assert glue_metrics("mnli", torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])) == {"accuracy": pytest.approx(0.75)}
    # STS-B: Pearson 15/sqrt(228) as above; the ranks [1,2,3] and [1,2,3] agree -> Spearman 1.
    result = glue_metrics("stsb", torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0]))
    assert result == pytest.approx({"pearson": 15 / math.sqrt(228), "spearman": 1.0})


def test_glue_metrics_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"task must be one of \['cola', 'sst2'.*'rte'\], got 'sst-2'"):
        glue_metrics("sst-2", PRED, GOLD)
    with pytest.raises(ValueError, match=r"predictions and labels must have the same shape, got predictions \(7,\) and labels \(6,\)"):
        glue_metrics("sst2", PRED, GOLD[:6])
    with pytest.raises(ValueError, match="predictions and labels must have the same shape"):
        glue_metrics("cola", PRED.reshape(7, 1), GOLD)


def exact_tail(successes: int, trials: int, probability: float) -> Fraction:
    """P(X >= successes) in rational arithmetic: the sum of the probabilities, term by term."""
    p = Fraction(probability)
    return sum((math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(successes, trials + 1)), Fraction(0))


@pytest.mark.parametrize("trials", [1, 7, 100, 300])
@pytest.mark.parametrize("probability", [0.5, 0.3, 0.511, 0.9])
def test_binomial_tail_is_the_exact_sum(trials, probability):
    for successes in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
        expected = float(exact_tail(successes, trials, probability))
        assert binomial_tail(successes, trials, probability) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_binomial_tail_at_the_edges_and_bad_arguments():
    assert binomial_tail(0, 10, 0.2) == 1.0 and binomial_tail(3, 10, 1.0) == 1.0 and binomial_tail(3, 10, 0.0) == 0.0
    assert binomial_tail(2000, 2000, 0.5) == pytest.approx(0.5**2000, rel=1e-9)  # far below a float's range in the terms' product
    assert binomial_tail(1060, 2000, 0.5) < 0.01 < binomial_tail(1040, 2000, 0.5)  # 2.7 and 1.8 standard deviations
    for successes, trials, probability, name in [(5, 4, 0.5, "successes"), (-1, 4, 0.5, "successes"), (1, 4, 1.5, "probability")]:
        with pytest.raises(ValueError, match=name):
            binomial_tail(successes, trials, probability)
