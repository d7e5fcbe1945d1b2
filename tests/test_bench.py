import json
from argparse import Namespace

import pytest

from tokenmix.bench import MEASUREMENT_FIELDS, Case, measure
from tokenmix.bench.cli import bench_cases
from tokenmix.bench.report import reading
from tokenmix.cli import main

FIELD_TYPES = {
    "kind": str,
    "mixer": str,
    "causal": bool,
    "length": int,
    "batch": int,
    "dim": int,
    "dtype": str,
    "device": str,
    "threads": int,
    "torch": str,
    "forward_ms": float,
    "forward_backward_ms": float,
    "tokens_per_s": float,
    "peak_mem_mb": float,
}
RATIO_FIELDS = ("fft_floor_ms", "fwd_ratio_to_fft", "fwdbwd_ratio_to_fft")


def check_record(record: dict) -> None:
    assert set(record) == set(MEASUREMENT_FIELDS) == set(FIELD_TYPES) | set(RATIO_FIELDS)
    for name, kind in FIELD_TYPES.items():
        assert isinstance(record[name], kind), name
    assert record["forward_ms"] > 0 and record["forward_backward_ms"] > 0 and record["peak_mem_mb"] >= 0
    fft_based = record["kind"] == "mixer" and record["mixer"] in ("tno", "fnet")
    for name in RATIO_FIELDS:
        assert (record[name] is not None) == fft_based, name
    if fft_based:
        assert record["fwd_ratio_to_fft"] == pytest.approx(record["forward_ms"] / record["fft_floor_ms"])


def test_tiny_bench_run_writes_valid_json_plots_and_report(tmp_path, capsys):
    output, plots, report = tmp_path / "new" / "bench.json", tmp_path / "plots", tmp_path / "report" / "bench.md"
    sizes = ["--dim", "8", "--model-dim", "8", "--batch-tokens", "64", "--repeats", "1"]
    arguments = ["bench", "--mixers", "tno", "--models", "tnn", "--lengths", "8,32", "--causal", "yes", *sizes]
    assert main([*arguments, "--output", str(output), "--plot", str(plots), "--report", str(report)]) == 0
    records = json.loads(output.read_text())
    assert len(records) == 3 * 2  # kinds x lengths, each measured in a fresh process
    for record in records:
        check_record(record)
    assert {r["kind"] for r in records} == {"mixer", "layer", "model"}
    assert sorted(p.name for p in plots.iterdir()) == ["memory.png", "ratios.png", "time_vs_length.png"]
    text = report.read_text()
    assert "tokenmix bench" in text and "## Reading" in text and "## The papers" in text and "](../plots/ratios.png)" in text
    assert "fwdbwd_ratio_to_fft" in capsys.readouterr().out


def test_measure_in_process_and_reading():
    record = measure(Case("mixer", "tno", True, 16, 4, 2), repeats=1).to_dict()
    check_record(record)
    longer = {**record, "length": 32, "forward_backward_ms": record["forward_backward_ms"] * 2}
    lines = reading([record, longer])
    assert any("target <= 1.3x" in line for line in lines)
    assert any("grows 1.00x" in line for line in lines)  # twice the time for twice the tokens


def test_reading_compares_names_and_judges_only_the_toeplitz_targets():
    base = {"kind": "mixer", "causal": True, "length": 8192, "batch": 1, "fft_floor_ms": None, "tokens_per_s": 1.0}
    tcn = {**base, "mixer": "tcn", "forward_ms": 2.0, "forward_backward_ms": 10.0, "peak_mem_mb": 100.0}
    ema = {**base, "mixer": "ema", "forward_ms": 20.0, "forward_backward_ms": 25.0, "peak_mem_mb": 150.0, "fft_floor_ms": 4.0}
    ema.update(fwd_ratio_to_fft=5.0, fwdbwd_ratio_to_fft=6.25)
    lines = reading([tcn, ema])
    assert "relative to tcn: ema 2.50x time, 1.50x memory (eval forward 10.00x time)." in lines[-1]
    assert any("ema mixer (causal), lengths 8192: eval forward 5.00x the FFT round trip;" in line for line in lines)
    assert not any("target" in line for line in lines)


def test_cases_skip_modes_a_mixer_or_model_lacks():
    arguments = Namespace(
        mixers=None, models=None, kinds=["mixer", "layer", "model"], causal="both", lengths=[64],
        dim=8, model_dim=8, batch_tokens=64, dtype="float32", device="cpu", option=[("path", "sparse"), ("tcn.depth", 2)],
    )  # fmt: skip
    built = bench_cases(arguments)
    assert all(case.options == ({"path": "sparse", "depth": 2} if case.name == "tcn" else {"path": "sparse"}) for case in built)
    cases = {(c.kind, c.name, c.causal) for c in built}
    assert ("mixer", "fnet", False) in cases and ("mixer", "fnet", True) not in cases
    assert ("mixer", "fnet_ar", True) in cases and ("mixer", "fnet_ar", False) not in cases
    assert ("mixer", "tno", False) in cases and ("mixer", "tno", True) in cases
    assert ("model", "transformer_xl", True) in cases and ("model", "transformer_xl", False) not in cases
    assert ("layer", "tnn", False) in cases


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--kinds", "mixer,nonsense"], "kinds"),
        (["--mixers", "nope"], "mixer name"),
        (["--models", "nope", "--kinds", "model"], "model name"),
    ],
)
def test_bad_bench_arguments(arguments, message, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--lengths", "8", *arguments])
    assert message in capsys.readouterr().err


def test_compare_matches_records_and_reports_speedups(tmp_path, capsys):
    base = {"kind": "mixer", "mixer": "tno", "causal": False, "length": 512, "fwdbwd_ratio_to_fft": 3.0}
    before = [
        {**base, "forward_ms": 10.0, "forward_backward_ms": 30.0},
        {**base, "length": 64, "forward_ms": 1.0, "forward_backward_ms": 3.0},
    ]
    after = [{**base, "forward_ms": 5.0, "forward_backward_ms": 20.0, "fwdbwd_ratio_to_fft": 2.0}]
    (tmp_path / "a.json").write_text(json.dumps(before))
    (tmp_path / "b.json").write_text(json.dumps(after))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "forward_speedup" in out and "1.5" in out  # 30 ms -> 20 ms
    assert out.count("\n") == 3  # header, rule, the one matching row
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "a.json"), str(tmp_path / "missing.json")])
    assert "not a readable bench JSON" in capsys.readouterr().err
