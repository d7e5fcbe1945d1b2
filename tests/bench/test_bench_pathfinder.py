"""``tokenmix bench --kinds pathfinder``: drawing generated Pathfinder images, their cache, and what they hold."""

import json
import os

import pytest
from conftest import usage_error

from tokenmix.bench.pathfinder import binomial_p, images_at, temporary_cache
from tokenmix.bench.run import bench_tables
from tokenmix.cli import main

TINY = ["--kinds", "pathfinder", "--pathfinder-resolutions", "32", "--pathfinder-images", "64", "--threads", "1"]


def test_a_tiny_pathfinder_run_writes_its_record_table_and_examples(tmp_path, capsys, monkeypatch):
    user_cache = tmp_path / "user-cache"
    monkeypatch.setenv("TOKENMIX_CACHE", str(user_cache))
    output, plots = tmp_path / "pathfinder.json", tmp_path / "plots"
    assert main(["bench", *TINY, "--output", str(output), "--plot", str(plots)]) == 0
    (record,) = json.loads(output.read_text())
    assert (record["kind"], record["resolution"], record["difficulty"], record["images"]) == ("pathfinder_gen", 32, "hard", 64)
    assert record["images_per_second"] == pytest.approx(64 / record["seconds"]) and record["seconds"] > 0
    assert 0 < record["cache_load_seconds"] < min(record["seconds"], record["cache_write_seconds"])  # read, not drawn again
    assert record["cache_images"] == 66 and record["cache_bytes"] > 66 * 32 * 32  # the train split and one val, one test image
    assert 0 < record["ink_fraction_p5"] <= record["ink_fraction"] <= record["ink_fraction_p95"] < 0.5
    assert 0 <= record["label_balance"] <= 1 and record["label_balance"] * 64 == round(record["label_balance"] * 64)
    assert record["binomial_p"] == pytest.approx(binomial_p(round(record["label_balance"] * 64), 64))
    assert 0 < record["distractors_mean"] <= record["distractors_attempted"] == 5  # 20 // (14 // 3) at 32 px
    assert record["paddles_mean"] == pytest.approx(2 * 14 + 4 * record["distractors_mean"])  # two targets of 14, distractors of 4
    assert (record["contour_length"], record["distractor_length"], record["marker_radius"]) == (14, 4, 1.5)
    assert record["git_commit"] and record["threads"] == 1 and record["load_average"] >= 0
    assert not user_cache.exists() and os.environ["TOKENMIX_CACHE"] == str(user_cache)  # a temporary cache, then the user's again
    printed = capsys.readouterr().out
    assert bench_tables([record]) in printed and all(column in printed for column in ("images_s", "cache_load_s", "binomial_p"))
    image = (plots / "pathfinder_examples.png").read_bytes()
    assert image.startswith(b"\x89PNG") and len(image) > 5000


def test_the_count_scales_with_the_side():
    assert [images_at(resolution, 500) for resolution in (32, 64, 128, 256)] == [500, 250, 125, 62]
    assert images_at(256, 1) == 1


def test_the_binomial_p_value_is_exact_and_two_sided():
    assert binomial_p(5, 10) == 1.0 and binomial_p(1, 1) == 1.0
    assert binomial_p(0, 10) == pytest.approx(2 / 1024) and binomial_p(10, 10) == pytest.approx(2 / 1024)
    assert binomial_p(2, 10) == pytest.approx(2 * (1 + 10 + 45) / 1024) and binomial_p(8, 10) == pytest.approx(binomial_p(2, 10))
    assert 0 < binomial_p(400, 1000) < 1e-9  # 6.3 standard deviations off


def test_the_temporary_cache_leaves_the_users_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMIX_CACHE", str(tmp_path))
    with temporary_cache() as folder:
        assert os.environ["TOKENMIX_CACHE"] == str(folder) != str(tmp_path) and folder.is_dir()
    assert os.environ["TOKENMIX_CACHE"] == str(tmp_path) and not folder.exists()
    monkeypatch.delenv("TOKENMIX_CACHE")
    with temporary_cache():
        pass
    assert "TOKENMIX_CACHE" not in os.environ


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--pathfinder-resolutions", "48", "resolutions must be among 32, 64, 128, 256"),
        ("--pathfinder-resolutions", "32,0", "resolutions must be positive"),
        ("--pathfinder-images", "0", "--pathfinder-images"),
        ("--pathfinder-difficulty", "medium", "--pathfinder-difficulty"),
    ],
)
def test_bad_pathfinder_options_are_usage_errors(option, value, named, capsys):
    message = usage_error(["bench", *TINY, option, value], capsys)
    assert option in message and named in message


def test_pathfinder_runs_alone(capsys):
    assert "--kinds pathfinder runs alone, not with ['mixer']" in usage_error(["bench", *TINY[:1], "pathfinder,mixer", *TINY[2:]], capsys)
    assert "runs alone, not with ['pathfinder']" in usage_error(["bench", *TINY[:1], "pathfinder,data", *TINY[2:]], capsys)
