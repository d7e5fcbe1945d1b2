import json
import os
import sys
import time
from argparse import Namespace
from dataclasses import fields

import pytest
import torch
from conftest import usage_error
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEventAvg

from tokenmix.bench import MEASUREMENT_FIELDS, Case, measure
from tokenmix.bench import run as bench_run
from tokenmix.bench import serve as serve_bench
from tokenmix.bench.plan import apply_presets, bench_cases
from tokenmix.bench.profiling import kernel_name, ranked_work
from tokenmix.bench.records import GenerateMeasurement, MixerGenerateMeasurement, failed_measurement
from tokenmix.bench.report import markdown_report, reading
from tokenmix.bench.timing import time_tokens
from tokenmix.bench.worker import run_in_subprocess
from tokenmix.cli import build_parser, main
from tokenmix.mixers.registry import list_mixers, mixer_class
from tokenmix.models.registry import list_models, model_spec
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
    "precision": str,
    "compiled": bool,
    "kernels": str,
}
SETTING_FIELDS = ("depth", "compile_mode")  # None where they do not apply (a mixer's depth, an eager case's mode)
RATIO_FIELDS = ("fft_floor_ms", "fft_channels_last_ms", "fft_channels_first_ms", "fwd_ratio_to_fft", "fwdbwd_ratio_to_fft")
SIZES = ["--dim", "8", "--model-dim", "8", "--batch-tokens", "64", "--repeats", "1"]


def check_record(record: dict, provenance: bool = True) -> None:
    assert (
        set(record)
        == set(MEASUREMENT_FIELDS)
        == set(FIELD_TYPES) | set(RATIO_FIELDS) | set(SETTING_FIELDS) | {"error", "profile", "busy_ms"}
    )
    assert (record["depth"] is not None) == (record["kind"] == "model") and (record["compile_mode"] is not None) == record["compiled"]
    for name, kind in FIELD_TYPES.items():
        if provenance or name not in ("retain_freed_memory", "git_commit"):
            assert isinstance(record[name], kind), name
    assert record["error"] is None and record["profile"] is None and record["busy_ms"] is None
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
    # one length: a worker process per kind is the cost here; lines over several lengths are drawn by the same
    # code (their axis: tests/cli/test_plots.py) and read by ``reading`` (test_measure_in_process_and_reading)
    arguments = ["bench", "--mixers", "tno", "--models", "tnn", "--lengths", "8", "--causal", "yes", *SIZES]
    assert main([*arguments, "--output", str(output), "--plot", str(plots), "--report", str(report)]) == 0
    records = json.loads(output.read_text())
    assert len(records) == 3  # one per kind, each measured in a fresh process
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


def test_a_failed_case_is_reported_and_the_others_kept(tmp_path, capsys, monkeypatch):
    def flaky(case, repeats, threads, profile):  # the others measured in this process (the worker: the tiny run above)
        if case.length == 16:
            return failed_measurement(case, "RuntimeError: out of memory")
        return measure(case, repeats)

    monkeypatch.setattr(bench_run, "run_in_subprocess", flaky)
    output, report = tmp_path / "bench.json", tmp_path / "bench.md"
    arguments = ["bench", "--mixers", "tno", "--kinds", "mixer", "--causal", "no", "--lengths", "8,16", *SIZES]
    assert main([*arguments, "--output", str(output), "--report", str(report)]) == 1
    records = json.loads(output.read_text())
    assert [r["error"] for r in records] == [None, "RuntimeError: out of memory"]
    assert records[1]["forward_ms"] is None and "out of memory" in capsys.readouterr().out
    assert "failed: RuntimeError: out of memory" in report.read_text()


def test_auto_device_is_resolved_before_the_cases_are_built(tmp_path, monkeypatch):
    """Measured in this process: a case built with device "auto" fails wherever it runs (``torch.device``)."""
    measured = []
    monkeypatch.setattr(bench_run, "run_in_subprocess", lambda case, *rest: measured.append(case) or measure(case, 1))
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
    assert [case.device for case in measured] == ([] if torch.cuda.is_available() else ["cpu"])  # CUDA: measured in process


def test_every_finished_case_is_on_disk_before_the_next_one(tmp_path, monkeypatch):
    calls = []

    def interrupted_after_one(case, repeats, threads, profile):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measure(case, repeats)

    monkeypatch.setattr(bench_run, "run_in_subprocess", interrupted_after_one)
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
        precision="fp32", compile=False, compile_mode="default", depth=None, kernels="torch",
    )  # fmt: skip
    built = bench_cases(arguments)
    assert all(case.kernels == "torch" for case in built)
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
        (["--mixers", "nope"], "argument --mixers: must be comma-separated names among attention"),
        (["--models", "nope", "--kinds", "model"], "argument --models: must be comma-separated names among fd_tnn"),
        (["--mixers", "tcn", "--kinds", "mixer", "-o", "tnc.kernel_size=17"], "'tnc' is not among the benchmarked names ['tcn']"),
        (["--kinds", "serve,model"], "--kinds serve runs alone, not with ['model']"),
        (["--kernels", "cuda"], "argument --kernels: must be one of auto, torch, fused"),
    ],
)
def test_bad_bench_arguments(arguments, message, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--lengths", "8", *arguments])
    assert message in capsys.readouterr().err


def test_the_kernels_of_a_case_are_recorded_and_fused_ones_refused_where_they_cannot_run(monkeypatch, capsys):
    """--kernels sets the factored Toeplitz products' path of the measuring process (tests/mixers/test_mixer_tno.py: what
    each runs); "fused" on a CPU, outside Triton's interpreter (which conftest.py turns on without a GPU), is refused."""
    assert measure(Case("mixer", "tno", True, 16, 4, 2, kernels="torch"), repeats=1).to_dict()["kernels"] == "torch"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    message = usage_error(["bench", "--kinds", "mixer", "--mixers", "tno", "--lengths", "8", *SIZES, "--kernels", "fused"], capsys)
    assert "the fused kernels run on CUDA tensors (or any under TRITON_INTERPRET=1), got cpu" in message or "tokenmix[fused]" in message


def test_compare_matches_records_and_reports_speedups(tmp_path, capsys):
    base = {"kind": "mixer", "mixer": "tno", "causal": False, "length": 512, "fwdbwd_ratio_to_fft": 3.0}
    before = [
        {**base, "forward_ms": 10.0, "forward_backward_ms": 30.0},
        {**base, "length": 64, "forward_ms": 1.0, "forward_backward_ms": 3.0},
    ]
    after = [{**base, "forward_ms": 5.0, "forward_backward_ms": 20.0, "fwdbwd_ratio_to_fft": 2.0}]
    after.append({"kind": "generate", "mixer": "tnn", "causal": True, "length": 512, "step_ms": 1.0})  # decoding: not compared
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
    assert "missing.json' does not exist" in capsys.readouterr().err


def test_compare_says_when_the_runs_were_measured_under_other_conditions(tmp_path, capsys):
    record = {"kind": "mixer", "mixer": "tno", "causal": False, "length": 512, "forward_ms": 1.0, "forward_backward_ms": 3.0}
    conditions = {"threads": 2, "device": "cpu", "dtype": "float32", "torch": "2.13.0", "git_commit": "abc"}
    (tmp_path / "a.json").write_text(json.dumps([{**record, **conditions}]))
    (tmp_path / "b.json").write_text(json.dumps([{**record, **conditions}]))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().err == ""
    (tmp_path / "b.json").write_text(json.dumps([{**record, **conditions, "threads": 1, "torch": "2.14.1", "git_commit": "def"}]))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "tokenmix compare: warning: threads differs: before 2; after 1: the speed-ups mix this change with the code's",
        "tokenmix compare: warning: torch differs: before 2.13.0; after 2.14.1: the speed-ups mix this change with the code's",
    ]  # a new commit is what a comparison is for


TAP_STREAMING = [name for name in list_mixers() if mixer_class(name).toeplitz_streaming]  # decoded against the direct product
GENERATE_SIZES = ["--kinds", "generate", "--model-dim", "8", "--dim", "8", "--repeats", "1", "--threads", "1"]


def record_fields(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def test_generate_run_writes_records_tables_and_plots(tmp_path, capsys, monkeypatch):
    def in_process(case, repeats, threads, profile):  # the measurement itself, without a worker process per case
        if case.name == "transformer_xl" and case.length == 16:
            return failed_measurement(case, "RuntimeError: out of memory")
        return measure(case, repeats)

    monkeypatch.setattr(bench_run, "run_in_subprocess", in_process)
    output, plots, report = tmp_path / "bench.json", tmp_path / "plots", tmp_path / "bench.md"
    arguments = [
        *GENERATE_SIZES,
        "--models",
        "tnn,transformer_xl",
        "--lengths",
        "8,16",
        "--recompute-max",
        "8",
        "--stream-lengths",
        "16,40",
    ]
    assert main(["bench", *arguments, "--output", str(output), "--plot", str(plots), "--report", str(report)]) == 1
    records = json.loads(output.read_text())
    models = [r for r in records if r["kind"] == "generate"]
    mixers = [r for r in records if r["kind"] == "generate_mixer"]
    assert [(r["mixer"], r["length"]) for r in models] == [("tnn", 8), ("tnn", 16), ("transformer_xl", 8), ("transformer_xl", 16)]
    assert all(set(r) == record_fields(GenerateMeasurement) and r["batch"] == 1 and r["dim"] == 8 for r in models)
    tnn_8, tnn_16, xl_8, xl_16 = models
    for record in (tnn_8, tnn_16, xl_8):
        assert record["error"] is None and record["prefill_ms"] > 0 and record["step_ms"] > 0 and record["state_bytes"] > 0
    assert tnn_16["state_bytes"] > tnn_8["state_bytes"]
    assert all(record["step_ratio"] > 0 for record in (tnn_8, tnn_16, xl_8)) and xl_16["step_ratio"] is None
    for record in (tnn_8, tnn_16, xl_8):  # decoded from static buffers too (eager on the CPU), timed beside the stream's step
        assert record["static_speedup"] == pytest.approx(record["step_ms"] / record["static_step_ms"])
    assert tnn_8["recompute_ratio"] == pytest.approx(tnn_8["recompute_ms"] / tnn_8["step_ms"]) and not tnn_8["recompute_skipped"]
    assert tnn_16["recompute_skipped"] and tnn_16["recompute_ms"] is None and tnn_16["error"] is None  # above --recompute-max
    assert xl_16["error"] == "RuntimeError: out of memory" and xl_16["step_ms"] is None
    assert [(r["mixer"], r["length"], r["dim"]) for r in mixers] == [(name, n, 8) for name in TAP_STREAMING for n in (16, 40)]
    for record in mixers:
        assert set(record) == record_fields(MixerGenerateMeasurement) and record["error"] is None
        assert record["direct_finished"] and record["direct_tokens"] == record["length"]
        assert record["direct_ratio"] == pytest.approx(record["direct_s"] / record["tiled_s"]) and record["max_abs_diff"] < 1e-4
        for curve in (record["tiled_curve"], record["direct_curve"]):
            ends = [1, 2, 4, 8, 16] + ([32, 40] if record["length"] == 40 else [])  # windows that double, cut at the length
            assert [w["to"] for w in curve] == ends and all(w["ms_per_token"] > 0 for w in curve)
    assert sorted(p.name for p in plots.iterdir()) == ["decode.png", "mixer_decode.png"]
    text = report.read_text()
    assert "## Decoding by the models (dim 8)" in text and "## Decoding by a Toeplitz mixer, token by token (dim 8)" in text
    assert "](plots/decode.png)" in text and "tnn: not recomputed at positions 16 (above --recompute-max)." in text
    assert "transformer_xl generate (causal) at length 16 failed: RuntimeError: out of memory" in text
    out = capsys.readouterr().out
    assert all(column in out for column in ("recompute_ratio", "step_ratio", "static_speedup", "direct_ratio"))
    assert "tnn: the static step (eager) against the stream step, by position: 8: " in text
    assert f"1 of {4 + 2 * len(TAP_STREAMING)} cases failed" in out


def test_a_crashing_worker_becomes_a_record_of_its_kind():
    """The worker's last error line becomes the record's ``error``, in the record of the case's kind (here a generate
    case's; a mixer case's failed record, with no time: test_a_failed_case_is_reported_and_the_others_kept)."""
    record = run_in_subprocess(Case("generate", "tnn", True, 8, 8, 1, options={"mixer": "nope"}), 1, 1).to_dict()
    assert set(record) == record_fields(GenerateMeasurement) and "mixer must be one of" in record["error"] and record["step_ms"] is None


def test_the_direct_product_stops_at_its_time_limit():
    case = Case("generate_mixer", "tno", True, 64, 8, 1, limits={"direct_max_seconds": 1e-9})
    record = measure(case).to_dict()
    assert record["direct_tokens"] == 1 and not record["direct_finished"] and record["direct_ratio"] is None
    assert record["direct_curve"] == [{"from": 0, "to": 1, "ms_per_token": record["direct_curve"][0]["ms_per_token"]}]
    assert record["tiled_curve"][-1]["to"] == 64 and record["max_abs_diff"] < 1e-5  # compared where both did the token
    lines = reading([record])
    assert "the direct product was stopped after 1 of 64 tokens" in lines[0]


def test_time_tokens_windows_double_and_stop_after_the_limit():
    times = time_tokens(lambda t: torch.tensor(float(t)), 10, torch.device("cpu"))
    assert times.tokens == 10 and [(w["from"], w["to"]) for w in times.windows] == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 10)]
    assert [float(y) for y in times.outputs] == [0, 1, 3, 7, 9]
    stopped = time_tokens(lambda t: time.sleep(0.01), 1000, torch.device("cpu"), max_seconds=0.035)
    assert 1 <= stopped.tokens <= 4 and stopped.windows[-1]["to"] == stopped.tokens and stopped.total_ms >= 35


def test_generate_cases_and_their_defaults():
    def cases(*flags):
        arguments = build_parser().parse_args(["bench", *flags])
        apply_presets(arguments)
        return bench_cases(arguments)

    assert not any(case.kind.startswith("generate") for case in cases())  # not part of the default run
    built = cases("--kinds", "generate")
    lm_models = sorted({case.name for case in built if case.kind == "generate"})
    assert lm_models == sorted(n for n in list_models() if "lm" in model_spec(n).tasks)
    assert sorted({case.length for case in built if case.kind == "generate"}) == [256, 1024, 4096, 16384]
    mixer_cases = [case for case in built if case.kind == "generate_mixer"]
    assert [(c.name, c.length, c.dim) for c in mixer_cases] == [(name, n, 1536) for name in TAP_STREAMING for n in (4096, 16384, 65536)]
    assert all(c.batch == 1 and c.causal for c in built)
    assert {json.dumps(c.limits) for c in built} == {'{"recompute_max": 8192}', '{"direct_max_seconds": 600.0}'}
    chosen = cases("--kinds", "generate,mixer", "--lengths", "64", "--stream-lengths", "128", "--models", "tnn", "--mixers", "tno")
    assert [(c.kind, c.length) for c in chosen if c.causal] == [("mixer", 64), ("generate", 64), ("generate_mixer", 128)]
    assert not cases("--kinds", "generate", "--causal", "no")  # decoding is causal


def test_distilled_variants_decode_beside_the_exact_models(monkeypatch, tmp_path):
    """``--distilled N`` adds, for each model with Toeplitz mixers, the model with ``ssm`` mixers of order N (its rows
    "NAME (ssm N)", a state that does not grow), and the ssm mixer decoded beside the Toeplitz mixers; ``--generate-batch``
    decodes that many sequences at once."""
    monkeypatch.setattr(bench_run, "run_in_subprocess", lambda case, repeats, threads, profile: measure(case, repeats))
    output = tmp_path / "bench.json"
    flags = ["--models", "tnn,mega", "--distilled", "4", "--generate-batch", "3", "--lengths", "8,32", "--stream-lengths", "8"]
    assert main(["bench", *GENERATE_SIZES, *flags, "--mixers", "tno", "--output", str(output)]) == 0
    mixers = [r for r in json.loads(output.read_text()) if r["kind"] == "generate_mixer"]
    assert [(r["mixer"], r["length"]) for r in mixers] == [("tno", 8), ("ssm (order 4)", 8)]  # the recurrence beside the tiled product
    assert all(r["direct_finished"] and r["max_abs_diff"] < 1e-4 for r in mixers)
    records = [r for r in json.loads(output.read_text()) if r["kind"] == "generate"]
    expected = [("tnn", 8), ("tnn (ssm 4)", 8), ("tnn", 32), ("tnn (ssm 4)", 32), ("mega", 8), ("mega", 32)]  # mega has no Toeplitz mixer
    assert [(r["mixer"], r["length"]) for r in records] == expected
    sizes = {(r["mixer"], r["length"]): r["state_bytes"] for r in records}
    assert sizes["tnn (ssm 4)", 8] == sizes["tnn (ssm 4)", 32] and sizes["tnn", 32] > sizes["tnn", 8]
    assert all(r["batch"] == 3 and r["error"] is None for r in records)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--recompute-max", "0"], "argument --recompute-max: must be an integer >= 1, got '0'"),
        (["--direct-max-seconds", "0"], "argument --direct-max-seconds: must be a finite number > 0"),
        (["--stream-lengths", "0"], "argument --stream-lengths: lengths must be positive integers"),
        (["-o", "tno.factored=maybe"], "with options {'factored': 'maybe'}: factored must be true or false, got 'maybe'"),
    ],
)
def test_bad_generate_options_are_refused_before_anything_is_measured(flags, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_run, "run_in_subprocess", lambda *arguments: pytest.fail("measured"))
    output = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *GENERATE_SIZES, "--models", "tnn", "--lengths", "8", "--stream-lengths", "8", *flags, "--output", str(output)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err and not output.exists()


@pytest.mark.slow
def test_serve_run_drives_the_real_server_and_writes_records_tables_and_a_plot(tmp_path, capsys):
    """A tiny ``--kinds serve`` run: every concurrency of every model, prefix reuse and the flood, each a record."""
    pytest.importorskip("fastapi", reason='bench --kinds serve needs the serve extra: pip install "tokenmix[serve]"')
    output, plots = tmp_path / "serve.json", tmp_path / "plots"
    # one model (the loop over models is all a second adds; the pinned run below serves tnn, the engine tests every model)
    flags = ["--kinds", "serve", "--models", "transformer", "--concurrency", "1,3", "--serve-requests", "1", "--serve-tokens", "4"]
    flags += ["--model-dim", "16", "--depth", "1", "--threads", "1", "--repeats", "2", "--output", str(output), "--plot", str(plots)]
    assert main(["bench", *flags]) == 0
    records = json.loads(output.read_text())
    assert [(r["kind"], r["model"], r.get("concurrency")) for r in records] == [
        (kind, model, concurrency)
        for model in ("transformer",)
        for kind, concurrency in (("serve", 1), ("serve", 3), ("serve_prefix", None), ("serve_flood", None))
    ]
    for record in records:
        if record["kind"] == "serve":
            assert record["tokens"] == 4 * record["concurrency"] and record["tokens_per_second"] > 0 and record["repeats"] == 2
            for rate in ("tokens_per_second", "batched_tokens_per_second", "sequential_tokens_per_second"):
                assert len(record[f"{rate}_runs"]) == 2 and record[rate] == min(record[f"{rate}_runs"])  # the lower middle
            phases = [record[f"engine_{phase}_seconds"] for phase in ("join", "decode", "prefill", "schedule")]
            assert record["engine_decode_seconds"] > 0 and min(phases) >= 0 and sum(phases) <= record["seconds"]
            assert record["clients_cpu_seconds"] > 0
            linux = sys.platform.startswith("linux")  # read from /proc in clock ticks: a tiny round may take none
            assert record["server_cpu_seconds"] >= 0 if linux else record["server_cpu_seconds"] is None
        if record["kind"] == "serve_flood":
            assert record["lost"] == 0 and record["completed"] + record["refused_429"] == 500
            assert record["peak_state_bytes"] <= record["budget_bytes"]
    printed = capsys.readouterr().out
    assert "vs_batched" in printed and "second_ttft_ms" in printed and "refused_429" in printed and "prefill_s" in printed
    assert (plots / "serve.png").stat().st_size > 0
    assert bench_run.bench_tables(records) in printed


def test_serve_rounds_are_summed_up_by_their_median_rates_and_every_request():
    """``_summary``: each rate the median over the rounds, the served run's phases from the round with the
    median served rate, latency percentiles over the requests of all rounds."""

    def found(rate: float, batched: float, first: float) -> dict:
        result = {"status": 200, "sent": 0.0, "first": first, "end": first + 1.0, "tokens": 11}
        rates = {"tokens_per_second": rate, "batched_tokens_per_second": batched, "sequential_tokens_per_second": 1.0}
        return {"results": [result], "tokens": 11, "seconds": 11 / rate, "engine_decode_seconds": rate / 100, **rates}

    record = serve_bench._summary([found(300.0, 10.0, 0.3), found(100.0, 30.0, 0.1), found(200.0, 20.0, 0.2)])
    assert record["tokens_per_second"] == 200.0 and record["batched_tokens_per_second"] == 20.0
    assert record["tokens_per_second_runs"] == [300.0, 100.0, 200.0] and record["engine_decode_seconds"] == 2.0
    assert record["requests"] == 1 and record["ttft_p50_ms"] == pytest.approx(200.0) and record["ttft_p99_ms"] == pytest.approx(300.0)
    assert "results" not in record


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="pinning needs Linux and 2 CPUs")
def test_a_pinned_serve_run_keeps_the_server_and_the_clients_on_their_own_cpus(tmp_path, capsys, monkeypatch):
    """``--server-cpus``: the server (and the in-process decoding) on those CPUs, the clients on the
    others, as each process's affinity says; the bench's own CPUs are given back afterwards. Pinning is
    not the default (the run above is unpinned, as users run it); the flood, a second server that pinning
    does not change, is left out here (checked by the run above)."""
    pytest.importorskip("fastapi", reason='bench --kinds serve needs the serve extra: pip install "tokenmix[serve]"')
    flood = ("requests", "completed", "refused_429", "lost", "budget_bytes", "peak_state_bytes", "seconds")
    monkeypatch.setattr(serve_bench, "_flood", lambda *arguments: dict.fromkeys(flood, 0))
    mine = sorted(os.sched_getaffinity(0))
    output = tmp_path / "serve.json"
    flags = ["--kinds", "serve", "--models", "tnn", "--concurrency", "2", "--serve-requests", "1", "--serve-tokens", "3", "--repeats", "1"]
    flags += ["--model-dim", "16", "--depth", "1", "--threads", "1", "--server-cpus", str(mine[0]), "--output", str(output)]
    assert main(["bench", *flags]) == 0
    served = [record for record in json.loads(output.read_text()) if record["kind"] == "serve"]
    assert [(r["server_cpus"], r["client_cpus"]) for r in served] == [([mine[0]], mine[1:])]
    assert sorted(os.sched_getaffinity(0)) == mine
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *flags[:-4], "--server-cpus", ",".join(map(str, mine))])
    assert exit_info.value.code == 2 and "--server-cpus must leave at least one" in capsys.readouterr().err


def test_the_precision_kind_tabulates_each_mixers_errors_against_float64(tmp_path, capsys):
    """``--kinds precision``: a record per mixer mode and length with the relative errors of output and gradients;
    float32 has nothing to compare and is refused. tno rounds only its input and output (inner precision float32),
    attention runs its products in bf16: the two ways; one direction each (a worker process per record)."""
    output = tmp_path / "precision.json"
    arguments = ["bench", "--kinds", "precision", "--mixers", "tno,attention", "--lengths", "7", "--dim", "8", "--precision", "bf16"]
    assert main([*arguments, "--causal", "yes", "--output", str(output)]) == 0
    records = json.loads(output.read_text())
    assert {(r["mixer"], r["causal"]) for r in records} == {("tno", True), ("attention", True)}
    for record in records:
        assert record["kind"] == "precision" and record["precision"] == "bf16" and record["error"] is None
        assert 0 < record["output_error"] < 3e-2 and 0 < record["input_grad_error"] < 3e-2 and 0 < record["parameter_grad_error"] < 3e-2
    assert "output_error" in capsys.readouterr().out
    message = usage_error(["bench", "--kinds", "precision", "--mixers", "tno", "--lengths", "7", "--dim", "8"], capsys)
    assert "--kinds precision measures a mixed precision against float64: give --precision bf16 or fp16" in message


def profiled_event(key: str, device_type: DeviceType, self_cpu_us: float = 0.0, self_device_us: float = 0.0, annotation=False):
    event = FunctionEventAvg()
    event.key, event.device_type, event.is_user_annotation = key, device_type, annotation
    event.self_cpu_time_total, event.self_device_time_total = self_cpu_us, self_device_us
    return event


def test_a_cuda_profile_ranks_kernels_and_counts_each_once():
    """kineto's averaged events on CUDA: operators carry their kernels' device time too, and a named range leaves a span
    on the device; the kernels alone make the busy time, two instances of one template one row."""
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [
        profiled_event("aten::mm", cpu, self_cpu_us=30.0, self_device_us=600.0),
        profiled_event("sm90_xmma_gemm_bf16bf16_bf16f32", cuda, self_device_us=600.0),
        profiled_event("aten::mul", cpu, self_cpu_us=20.0, self_device_us=300.0),
        profiled_event("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float> >(int, MulFunctor<float>)", cuda, 0, 200.0),
        profiled_event("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float> >(int, AddFunctor<float>)", cuda, 0, 100.0),
        profiled_event("Memcpy DtoD (Device -> Device)", cuda, self_device_us=300.0),
        profiled_event("tokenmix::channels_first", cuda, self_device_us=900.0, annotation=True),
    ]
    rows, busy_ms = ranked_work(events, on_device=True, steps=3)
    assert busy_ms == pytest.approx(1.2 / 3)
    assert [(row["op"], row["share"]) for row in rows] == [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 0.5),
        ("at::native::vectorized_elementwise_kernel", 0.25),
        ("Memcpy DtoD", 0.25),
    ]
    cpu_rows, cpu_ms = ranked_work(events, on_device=False, steps=1)
    assert cpu_rows[0]["op"] == "aten::mm" and cpu_ms == pytest.approx(0.05)


KERNEL_NAMES = [  # (a kernel as kineto names it, shortened; its name in a profile)
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*)",
        "at::native::vectorized_layer_norm_kernel",
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::OpaqueType<4u>, "
        "unsigned int, 2>(...)",
        "at::native::CatArrayBatchedCopy_contig",
    ),
    (
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float, cublasGemvParamsEx<int, float> >"
        "(cublasGemvParamsEx<int, float>)",
        "internal::gemvx::kernel",
    ),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, int)", "softmax_warp_forward"),
    (
        "void regular_fft_factor<128u, EPT<8u>, 16u, 8u, (padding_t)1, (twiddle_t)0, float>(kernel_arguments_t<unsigned int>)",
        "regular_fft_factor",
    ),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
]


@pytest.mark.parametrize(("key", "name"), KERNEL_NAMES)
def test_a_kernel_is_named_without_its_signature(key, name):
    assert kernel_name(key) == name


def test_the_report_says_how_busy_a_profiled_cuda_step_keeps_the_device(tmp_path):
    record = measure(Case("mixer", "tno", True, 16, 32, 8), repeats=1, profile=True).to_dict()
    assert record["busy_ms"] is None  # the CPU: its operators' self time is no measure of idling
    on_cuda = {**record, "device": "cuda", "busy_ms": record["forward_backward_ms"] / 4}
    text = markdown_report([on_cuda], "tokenmix bench --profile", "test machine", [], tmp_path / "report.md")
    assert f"The device is busy {on_cuda['busy_ms']:.4g} ms of the step's {record['forward_backward_ms']:.4g} ms (25%)." in text
