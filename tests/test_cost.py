"""benchmarks/cost.py: hours from work and throughput, on tiny numbers worked out by hand; the paper's
own figures come out as the paper printed them; it reads benchmarks/gpu.py's output."""

import json

import pytest

from helpers import load_script

cost = load_script("benchmarks/cost.py")
gpu = load_script("benchmarks/gpu.py")


def test_hours_are_the_work_over_the_throughput_of_all_gpus():
    # 1000 updates x 90 tokens = 90,000 tokens at 2 GPUs x 25 tokens/s = 1800 s = 0.5 h
    assert cost.training_hours(1000, 90, 25, gpus=2) == pytest.approx(0.5)
    assert cost.training_hours(1000, 90, 25, gpus=2, scaling=0.5) == pytest.approx(1.0)


def test_a_throughput_measured_for_one_model_gives_another_at_equal_model_flops():
    small, large = cost.Recipe("s", "tiny", 10, 1000), cost.Recipe("l", "base", 10, 1000)
    rate, where = cost.tokens_per_second(small, {"base": 100.0}, "measured", None, [small, large])
    assert rate * small.flops_per_token == pytest.approx(100.0 * large.flops_per_token)
    assert where.startswith("derived from base")
    rate, where = cost.tokens_per_second(small, {}, "", 2.0, [small])  # 2 TFLOP/s
    assert rate == pytest.approx(2e12 / small.flops_per_token) and "--model-tflops" in where


def test_the_papers_step_times_imply_its_throughput_and_table_2_its_hours_times_peak():
    base = cost.Recipe("b", "base", 100_000, 37000)
    implied = cost.paper_throughput(base)
    assert implied["tokens_per_second_8_gpus"] == 25_000 / 0.4
    assert implied["model_tflops_per_gpu"] == pytest.approx(25_000 / 0.4 * base.flops_per_token / 8 / 1e12)
    # Table 2 of the paper: 3.3e18 (base) and 2.3e19 (big) FLOPs = hours x 8 GPUs x 9.5 TFLOP/s
    for preset, printed in (("base", 3.3e18), ("big", 2.3e19)):
        assert cost.PAPER[preset]["hours"] * 3600 * 8 * cost.P100_PEAK_TFLOPS * 1e12 == pytest.approx(printed, rel=0.02)


def test_every_recipe_on_1_and_8_gpus_beside_the_paper(tmp_path):
    output = tmp_path / "cost.json"
    rows = cost.main(["--tokens-per-second", "big=1000", "--output", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(rows))
    assert {row["name"] for row in rows} == {path.stem for path in cost.RECIPES.glob("wmt14-*.yaml")}
    for row in rows:
        if row["preset"] == "big":
            assert row["throughput_from"] == "given (--tokens-per-second)"
            assert row["hours_1_gpus"] == pytest.approx(300_000 * 25_000 / 1000 / 3600)
            assert row["paper_hours_8_p100"] == 84
        else:
            assert row["throughput_from"].startswith("derived")
            assert row["paper_hours_8_p100"] == 12
        assert row["hours_8_gpus"] == pytest.approx(row["hours_1_gpus"] / 8)
        assert row["gpu_hours_8_gpus"] == pytest.approx(row["hours_1_gpus"])


def test_reads_the_fastest_training_measurement_of_benchmarks_gpu_py(tmp_path):
    output = tmp_path / "gpu.json"
    results = gpu.main(
        [
            "--no-recipe",
            "--device",
            "cpu",
            "--presets",
            "tiny",
            "--modes",
            "eager",
            "--dtype",
            "float32",
            "--max-tokens",
            "256",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--no-decode",
            "--no-loop",
            "--no-train-run",
            "--no-eval",
            "--output",
            str(output),
        ]
    )
    # a slower second mode and a failed one must not count
    slower = {**results[1], "mode": "compiled", "target_tokens_per_second": results[1]["target_tokens_per_second"] / 2}
    output.write_text(
        json.dumps([*results, slower, {"what": "training", "preset": "big", "mode": "eager", "error": "x"}])
    )
    rates, where = cost.throughputs_from_gpu_json(output)
    assert rates == {"tiny": results[1]["target_tokens_per_second"]}
    assert "cpu" in where and "tiny: eager float32" in where


@pytest.mark.parametrize("text", ["big", "huge=100", "big=fast", "base=0"])
def test_a_malformed_throughput_says_how_to_write_it(text):
    with pytest.raises(ValueError, match="PRESET=TOKENS"):
        cost.parse_tokens_per_second(text)
