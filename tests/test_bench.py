import json
from argparse import Namespace

import pytest
import torch

from tokenmix.bench import MEASUREMENT_FIELDS, Case, measure
from tokenmix.bench import cli as bench_cli
from tokenmix.bench.cli import apply_presets, bench_cases
from tokenmix.bench.measure import failed_measurement
from tokenmix.bench.report import markdown_report, reading
from tokenmix.bench.worker import run_in_subprocess
from tokenmix.cli import build_parser, main
from tokenmix.version import source_revision

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
    "retain_freed_memory": bool,
    "git_commit": str,
}
RATIO_FIELDS = ("fft_floor_ms", "fft_channels_last_ms", "fft_channels_first_ms", "fwd_ratio_to_fft", "fwdbwd_ratio_to_fft")
SIZES = ["--dim", "8", "--model-dim", "8", "--batch-tokens", "64", "--repeats", "1"]


def check_record(record: dict, provenance: bool = True) -> None:
    assert set(record) == set(MEASUREMENT_FIELDS) == set(FIELD_TYPES) | set(RATIO_FIELDS) | {"error", "profile"}
    for name, kind in FIELD_TYPES.items():
        if provenance or name not in ("retain_freed_memory", "git_commit"):
            assert isinstance(record[name], kind), name
    assert record["error"] is None and record["profile"] is None
    assert record["forward_ms"] > 0 and record["forward_backward_ms"] > 0 and record["peak_mem_mb"] >= 0
    fft_based = record["kind"] == "mixer" and record["mixer"] in ("tno", "fnet")
    for name in RATIO_FIELDS:
        assert (record[name] is not None) == fft_based, name
    if fft_based:
        assert record["fft_floor_ms"] == min(record["fft_channels_last_ms"], record["fft_channels_first_ms"])
        assert record["fwd_ratio_to_fft"] == pytest.approx(record["forward_ms"] / record["fft_floor_ms"])


@pytest.mark.slow
def test_tiny_bench_run_writes_valid_json_plots_and_report(tmp_path, capsys):
    output, plots, report = tmp_path / "new" / "bench.json", tmp_path / "plots", tmp_path / "report" / "bench.md"
    arguments = ["bench", "--mixers", "tno", "--models", "tnn", "--lengths", "8,32", "--causal", "yes", *SIZES]
    assert main([*arguments, "--output", str(output), "--plot", str(plots), "--report", str(report)]) == 0
    records = json.loads(output.read_text())
    assert len(records) == 3 * 2  # kinds x lengths, each measured in a fresh process
    for record in records:
        check_record(record)
    assert {r["kind"] for r in records} == {"mixer", "layer", "model"}
    assert all(r["retain_freed_memory"] is True and r["git_commit"] == source_revision() for r in records)
    assert sorted(p.name for p in plots.iterdir()) == ["memory.png", "ratios.png", "time_vs_length.png"]
    text = report.read_text()
    assert "tokenmix bench" in text and "## Reading" in text and "](../plots/ratios.png)" in text
    assert "target" not in text.lower() and "paper" not in text.lower()  # targets and claims live in the docs
    assert "fwdbwd_ratio_to_fft" in capsys.readouterr().out


def test_measure_in_process_and_reading():
    record = {**measure(Case("mixer", "tno", True, 16, 4, 2), repeats=1).to_dict()}
    check_record(record, provenance=False)
    longer = {**record, "length": 32, "forward_backward_ms": record["forward_backward_ms"] * 2}
    lines = reading([record, longer])
    assert any("against the FFT floor (eval forward / training step), by length: 16:" in line for line in lines)
    assert any("grows 1.00x" in line for line in lines)  # twice the time for twice the tokens


def test_profile_names_the_operators_of_a_training_step(tmp_path):
    record = measure(Case("mixer", "tno", True, 300, 600, 8), repeats=1, profile=True).to_dict()
    operators = [row["op"] for row in record["profile"]]
    assert "aten::_fft_r2c" in operators and "tokenmix::channels_first" in operators  # blocked transposes, by name
    assert all(row["self_ms"] >= 0 and 0 <= row["share"] <= 1 for row in record["profile"])
    text = markdown_report([record], "tokenmix bench --profile", "test machine", [], tmp_path / "report.md")
    assert "## Where a training step's time goes" in text and "tokenmix::channels_first" in text


def test_reading_compares_names():
    base = {"kind": "mixer", "causal": True, "length": 8192, "batch": 1, "fft_floor_ms": None, "tokens_per_s": 1.0}
    tcn = {**base, "mixer": "tcn", "forward_ms": 2.0, "forward_backward_ms": 10.0, "peak_mem_mb": 100.0}
    ema = {**base, "mixer": "ema", "forward_ms": 20.0, "forward_backward_ms": 25.0, "peak_mem_mb": 150.0, "fft_floor_ms": 4.0}
    ema.update(fwd_ratio_to_fft=5.0, fwdbwd_ratio_to_fft=6.25)
    lines = reading([tcn, ema])
    assert "relative to tcn: ema 2.50x time, 1.50x memory (eval forward 10.00x time)." in lines[-1]
    assert any(
        "ema mixer (causal) against the FFT floor (eval forward / training step), by length: 8192: 5.00x / 6.25x" in line for line in lines
    )


def test_bad_options_are_refused_before_anything_is_measured(tmp_path, capsys):
    output = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--mixers", "tno,tcn", "--kinds", "mixer", "--lengths", "8", *SIZES, "-o", "tcn.depth=0", "--output", str(output)])
    assert exit_info.value.code == 2
    assert "mixer 'tcn' (bidirectional) with options {'depth': 0}: depth must be an integer >= 1" in capsys.readouterr().err
    assert not output.exists()


def test_output_paths_are_checked_before_anything_is_measured(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for flags, message in ((["--output", str(tmp_path)], "--output"), (["--plot", str(tmp_path / "afile")], "--plot")):
        with pytest.raises(SystemExit):
            main(["bench", "--mixers", "tno", "--kinds", "mixer", "--lengths", "8", *SIZES, *flags])
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_failed_case_is_reported_and_the_others_kept(tmp_path, capsys, monkeypatch):
    original = bench_cli.run_in_subprocess

    def flaky(case, repeats, threads, profile):
        if case.length == 16:
            return failed_measurement(case, "RuntimeError: out of memory")
        return original(case, repeats, threads, profile)

    monkeypatch.setattr(bench_cli, "run_in_subprocess", flaky)
    output, report = tmp_path / "bench.json", tmp_path / "bench.md"
    arguments = ["bench", "--mixers", "tno", "--kinds", "mixer", "--causal", "no", "--lengths", "8,16", *SIZES]
    assert main([*arguments, "--output", str(output), "--report", str(report)]) == 1
    records = json.loads(output.read_text())
    assert [r["error"] for r in records] == [None, "RuntimeError: out of memory"]
    assert records[1]["forward_ms"] is None and "out of memory" in capsys.readouterr().out
    assert "failed: RuntimeError: out of memory" in report.read_text()


def test_auto_device_is_resolved_before_the_cases_are_built(tmp_path):
    output = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--device",
                "auto",
                "--mixers",
                "fnet",
                "--kinds",
                "mixer",
                "--causal",
                "no",
                "--lengths",
                "8",
                *SIZES,
                "--output",
                str(output),
            ]
        )
        == 0
    )
    (record,) = json.loads(output.read_text())
    assert record["device"] == ("cuda" if torch.cuda.is_available() else "cpu") and record["forward_ms"] > 0


def test_a_crashing_worker_becomes_a_record():
    record = run_in_subprocess(Case("mixer", "tcn", False, 8, 4, 1, options={"depth": 0}), 1, 1, profile=False).to_dict()
    assert "depth must be an integer >= 1" in record["error"] and record["forward_ms"] is None


def test_every_finished_case_is_on_disk_before_the_next_one(tmp_path, monkeypatch):
    calls = []

    def interrupted_after_one(case, repeats, threads, profile):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(case, repeats)

    monkeypatch.setattr(bench_cli, "run_in_subprocess", interrupted_after_one)
    output = tmp_path / "bench.json"
    with pytest.raises(SystemExit):
        main(["bench", "--mixers", "tno", "--kinds", "mixer", "--causal", "no", "--lengths", "8,16", *SIZES, "--output", str(output)])
    assert [r["length"] for r in json.loads(output.read_text())] == [8]


def test_quick_keeps_explicit_choices():
    def preset(*flags):
        arguments = build_parser().parse_args(["bench", *flags])
        apply_presets(arguments)
        return arguments

    quick = preset("--quick")
    assert quick.lengths == [1024] and quick.kinds == ["mixer", "model"] and quick.repeats == 3 and quick.dim == 384
    chosen = preset("--quick", "--lengths", "64", "--kinds", "layer", "--dim", "32")
    assert chosen.lengths == [64] and chosen.kinds == ["layer"] and chosen.dim == 32 and chosen.repeats == 3
    full = preset()
    assert full.lengths == [512, 2048, 8192] and full.kinds == ["mixer", "layer", "model"] and full.repeats == 7


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
        (["--mixers", "tcn", "--kinds", "mixer", "-o", "tnc.kernel_size=17"], "'tnc' is not among the benchmarked names ['tcn']"),
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
    (tmp_path / "quick.json").write_text(json.dumps([{**after[0], "dim": 384}]))
    (tmp_path / "full.json").write_text(json.dumps([{**before[0], "dim": 1536}]))
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "full.json"), str(tmp_path / "quick.json")])
    assert "share no comparable case" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "a.json"), str(tmp_path / "missing.json")])
    assert "not a readable bench JSON" in capsys.readouterr().err
