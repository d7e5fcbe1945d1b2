"""The command line: bad input is one clear line naming the argument; bugs keep their traceback."""

import argparse
import json
import shutil

import pytest
import torch
from conftest import INTERPRETED_TRITON, TINY_RUN, history_kernel_launches, usage_error

import tokenmix
from tokenmix.cli import build_parser, main
from tokenmix.cli.common import printable
from tokenmix.mixers.registry import list_mixers
from tokenmix.models.registry import list_models


@pytest.fixture(scope="module")
def run(tiny_runs, tmp_path_factory):
    """A trained tiny causal LM run directory: the session's, copied once for this module (no test here changes it)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    shutil.copytree(tiny_runs["lm"], out)
    return out


def test_unknown_model_option_lists_the_accepted_ones(text_file, tmp_path, capsys):
    error = usage_error(["train", "--data", text_file, "-o", "foo=1", "--out", str(tmp_path / "x")], capsys)
    assert "unknown option 'foo' for model 'tnn'" in error and "rpe_dim" in error and "decay" in error
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "-0.001"], "argument --lr: must be a finite number > 0, got '-0.001'"),
        (["--lr", "nan"], "argument --lr: must be a finite number"),
        (["--weight-decay", "-1"], "argument --weight-decay: must be"),
        (["--warmup", "-1"], "argument --warmup: must be an integer >= 0"),
        (["--save-every", "soon"], "save_every must be"),
        (["--threads", "-1"], "argument --threads: must be an integer >= 1"),
        (["--device", "cuda:7"], "not available"),
        (["--device", "tpu"], "device must be"),
        (["--model", "lstm"], "argument --model: must be one of fd_tnn"),
        (["--beta1", "1"], "argument --beta1: must be a finite number >= 0 and < 1, got '1'"),
        (["--out", "README.md"], "is a file; give a folder for the run"),
    ],
)
def test_bad_train_settings_are_one_line_each(text_file, tmp_path, capsys, flags, message):
    (tmp_path / "README.md").write_text("a file, not a run folder")
    flags = [str(tmp_path / flag) if flag == "README.md" else flag for flag in flags]
    error = usage_error(["train", "--data", text_file, "--out", str(tmp_path / "x"), *flags], capsys)
    assert message in error and error.count("\n") == 1
    assert (tmp_path / "README.md").read_text() == "a file, not a run folder"


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("eval", ["--batch-size", "0"], "--batch-size: must be an integer >= 1"),
        ("eval", ["--batch-size", "-1"], "--batch-size: must be an integer >= 1"),
        ("eval", ["--max-tokens", "0"], "--max-tokens: must be an integer >= 1"),
        ("eval", ["--max-tokens", "-5"], "--max-tokens: must be an integer >= 1"),
        ("eval", ["--threads", "-1"], "--threads: must be an integer >= 1"),
        ("eval", ["--device", "cuda"], "not available"),
        ("generate", ["--temperature", "nan"], "--temperature: must be a finite number >= 0"),
        ("generate", ["--temperature", "inf"], "--temperature: must be a finite number >= 0"),
        ("generate", ["--temperature", "-1"], "--temperature: must be a finite number >= 0"),
        ("generate", ["--top-k", "-1"], "--top-k: must be an integer >= 0"),
        ("generate", ["--threads", "0"], "--threads: must be an integer >= 1"),
        ("generate", ["--device", "cuda"], "not available"),
        ("generate", ["--prompt", ""], "argument --prompt: must be a prompt, not empty"),
        ("plot", ["--length", "0"], "--length: must be an integer >= 1"),
        ("plot", ["--channel", "-1"], "--channel: must be an integer >= 0"),
        ("plot", ["--channel", "9999"], "--channel must be in [0, 23]"),
        ("plot", ["--out", "README.md"], "--out"),
    ],
)
def test_bad_arguments_of_eval_generate_plot(run, capsys, command, flags, message, tmp_path):
    (tmp_path / "README.md").write_text("a file, not a folder")
    flags = [str(tmp_path / flag) if flag == "README.md" else flag for flag in flags]
    extra = ["--out", str(tmp_path / "plots")] if command == "plot" and "--out" not in flags else []
    assert message in usage_error([command, str(run), *flags, *extra], capsys)


def test_plot_without_a_run_refuses_a_channel_and_eval_refuses_empty_lengths(run, tmp_path, capsys):
    assert "--channel applies to a run's operator heatmaps" in usage_error(["plot", "--channel", "3", "--out", str(tmp_path / "p")], capsys)
    assert not (tmp_path / "p").exists()  # a refused command leaves nothing behind
    assert "lengths must be comma-separated integers" in usage_error(["eval", str(run), "--lengths", "512,,1024"], capsys)


def test_eval_json_into_a_new_folder_is_written(run, tmp_path):
    target = tmp_path / "new" / "folder" / "results.json"
    assert main(["eval", str(run), "--json", str(target), "--threads", "1"]) == 0
    written = json.loads(target.read_text())
    assert written["results"][0]["bpb"] > 0
    assert written["tokenmix_version"] == tokenmix.__version__ and "git_commit" in written


def test_generate_without_top_k_and_with_control_bytes_escaped(run, capsys):
    assert main(["generate", str(run), "--top-k", "0", "--max-new-tokens", "20", "--prompt", "a\x1bb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("a\\x1bb") and "\x1b" not in out
    assert printable(b"ok\n\tx\x07\x00") == "ok\n\tx\\x07\\x00"


def test_sampled_text_is_the_same_streamed_or_batched(run, capsys):
    prompts = ["--prompt", "To", "--prompt", "be, or", "--temperature", "1.0", "--seed", "7", "--max-new-tokens", "30", "--threads", "1"]
    assert main(["generate", str(run), *prompts]) == 0
    batched = capsys.readouterr().out
    assert main(["generate", str(run), *prompts, "--stream"]) == 0
    assert capsys.readouterr().out == batched and batched.count("\n---\n") == 1
    assert main(["generate", str(run), *prompts, "--decoding", "static"]) == 0  # static buffers, eager on the CPU
    assert capsys.readouterr().out == batched


@INTERPRETED_TRITON
def test_generate_steps_static_buffers_by_the_fused_kernel_when_told(run, capsys, monkeypatch):
    """``--kernels fused`` (``--device auto``: the CPU here, in Triton's interpreter): each static step's Toeplitz product
    by the history kernel, the text that of the stream; where the kernels cannot run, refused in one line."""
    prompts = ["--prompt", "To", "--prompt", "be, or", "--temperature", "1.0", "--seed", "7", "--max-new-tokens", "12"]
    assert main(["generate", str(run), *prompts]) == 0
    stream = capsys.readouterr().out
    launches = history_kernel_launches(monkeypatch)
    assert main(["generate", str(run), *prompts, "--decoding", "static", "--kernels", "fused", "--device", "auto"]) == 0
    assert capsys.readouterr().out == stream and launches and all(grid[0] == 2 for grid, _ in launches)  # both rows each step
    monkeypatch.delenv("TRITON_INTERPRET")
    error = usage_error(["generate", str(run), "--kernels", "fused", "--device", "auto"], capsys)
    assert "the fused kernels run on CUDA tensors (or any under TRITON_INTERPRET=1), got cpu" in error


def test_compare_refuses_a_file_that_is_not_a_bench_output(run, tmp_path, capsys):
    (tmp_path / "eval.json").write_text(json.dumps({"results": []}))
    (tmp_path / "list.json").write_text(json.dumps([{"length": 1}]))
    for other in ("eval.json", "list.json"):
        assert "not a `tokenmix bench --output` file" in usage_error(["compare", str(tmp_path / other), str(tmp_path / other)], capsys)
    record = {"mixer": "tno", "causal": False, "length": 8, "forward_ms": 1.0}
    for times in ({"forward_backward_ms": 0}, {"forward_backward_ms": "fast"}):
        (tmp_path / "edited.json").write_text(json.dumps([{**record, **times}]))
        path = str(tmp_path / "edited.json")
        assert "not positive numbers" in usage_error(["compare", path, path], capsys)


def test_an_internal_value_error_keeps_its_traceback(run, monkeypatch):
    """Only input problems are one-line usage errors: a ValueError from a bug during the work propagates."""

    def broken(*args, **kwargs):
        raise ValueError("a bug deep in the evaluation")

    monkeypatch.setattr("tokenmix.train.objectives.evaluate_lm", broken)
    with pytest.raises(ValueError, match="a bug deep"):
        main(["eval", str(run)])


def test_help_names_models_mixers_and_every_option(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in list_models() + list_mixers())
    subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for name, subparser in subcommands.choices.items():
        for action in subparser._actions:
            assert action.help, f"tokenmix {name} {action.option_strings or action.dest} has no help line"
    train = subcommands.choices["train"].format_help()
    assert "--save-every" in train and "checkpoint" in train and "lstm" not in train and "ski_tnn" in train
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"tokenmix {tokenmix.__version__}"


def test_checkpoint_with_another_task_cannot_generate(tiny_runs, capsys):
    assert "causal LM checkpoint" in usage_error(["generate", str(tiny_runs["mlm"])], capsys)


def test_a_recall_run_cannot_generate_text(tmp_path, capsys):
    out = tmp_path / "recall"
    assert main(["train", "--data", "assoc-recall", *TINY_RUN, "--steps", "1", "--out", str(out)]) == 0
    assert "which is not text" in usage_error(["generate", str(out), "--prompt", "12"], capsys)


def test_library_errors_name_the_argument():
    with pytest.raises(ValueError, match="unknown option 'foo' for mixer 'tno'; accepted options: activation"):
        tokenmix.build_mixer("tno", 4, foo=1)
    with pytest.raises(ValueError, match="heads"):
        tokenmix.build_mixer("attention", 6, heads=4)
    assert tokenmix.build_mixer("chunked_attention", 4).heads == 2  # the default fits every even dim
    assert tokenmix.build_mixer("attention", 3, position="none").heads == 1
    with pytest.raises(ValueError, match="even head width, impossible with dim=3"):
        tokenmix.build_mixer("attention", 3)
    model = tokenmix.build_model("tnn", vocab_size=10, dim=8, depth=1)
    with pytest.raises(ValueError, match="mask must be a bool torch.Tensor"):
        model(torch.zeros(1, 3, dtype=torch.long), [[True, True, True]])
