"""benchmarks/gpu.py runs anywhere: on this CPU with a tiny model, its numbers add up."""

import json

import pytest


from helpers import load_script
from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.training.flops import training_flops_per_target_token

gpu = load_script("benchmarks/gpu.py")


def test_synthetic_lengths_look_like_wmt():
    lengths = gpu.synthetic_lengths(20000, seed=0)
    assert 24 < lengths.mean() < 32 and lengths.min() >= 2 and lengths.max() <= 250


def test_a_tiny_cpu_run_measures_training_and_decoding(tmp_path):
    output = tmp_path / "gpu.json"
    results = gpu.main(["--device", "cpu", "--presets", "tiny", "--modes", "eager", "--dtype", "bfloat16",
                        "--max-tokens", "512", "--vocab-size", "1000", "--warmup", "1", "--steps", "2", "--decode-presets", "tiny",
                        "--decode-batch", "3", "--decode-tokens", "4", "--decode-repeats", "1", "--no-loop", "--no-train-run",
                        "--output", str(output)])
    machine, training, decoding = results
    assert machine["device"] == "cpu" and "error" not in training and "error" not in decoding
    assert training["steps"] == 2
    for model in ("ours", "marian"):
        for phase in ("unseen", "steady"):
            entry = training[f"{model}_{phase}"]
            assert entry["tokens_per_second"] > entry["target_tokens_per_second"] > 0
            assert entry["worst_step_seconds"] >= entry["median_step_seconds"] > 0
    ratio = training["marian_over_ours_steady"]
    assert ratio["quartiles"][0] <= ratio["median"] <= ratio["quartiles"][1]
    assert training["padding_fraction"] < 0.25  # a few batches padded to bucket shapes
    assert decoding["new_tokens"] == 4 and decoding["sentences_per_second"] > 0
    assert decoding["ours_over_marian"] == pytest.approx(decoding["sentences_per_second"] / decoding["marian_sentences_per_second"])
    assert json.loads(output.read_text()) == json.loads(json.dumps(results))
    table = output.with_suffix(".md").read_text()
    assert "training tiny eager, steady state" in table and "decoding tiny eager, beam 4" in table


def test_shapes_only_an_epoch_has_few_shapes_and_little_padding(capsys):
    """The targets for an epoch of WMT-like pairs: at most 128 shapes, at most 12% padding."""
    (result,) = gpu.main(["--shapes-only", "--pairs", "1000000", "--max-tokens", "12288"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["batches"] > 2000 and result["distinct_shapes"] <= 128 and result["padding_fraction"] <= 0.12
    # Within ~20% of max_tokens per side: no batch is left half-empty to save a shape.
    assert result["real_tokens_per_batch_and_side"] > 0.8 * 12288


def test_loop_times_the_training_loop_against_the_raw_step():
    """--loop runs train.py's loop (build_trainer) and the raw step on the same batches, alternating."""
    machine, loop = gpu.main(["--loop", "--device", "cpu", "--presets", "tiny", "--dtype", "float32",
                              "--max-tokens", "256", "--loop-steps", "12"])
    assert machine["what"] == "machine" and loop["what"] == "loop" and loop["updates"] == 9
    assert loop["raw_step_seconds"] > 0 and loop["loop_seconds_per_update"] > 0
    assert loop["loop_over_raw"] == loop["loop_seconds_per_update"] / loop["raw_step_seconds"]
    assert loop["loop_over_raw_quartiles"][0] <= loop["loop_over_raw_quartiles"][1]


def test_train_run_reads_target_tokens_per_second_from_the_runs_own_metrics(tmp_path):
    """The real train.py (`run.main`) for a budget in minutes; its MFU from the pairs' FLOPs per target token."""
    output = tmp_path / "gpu.json"
    machine, run = gpu.main(["--device", "cpu", "--presets", "tiny", "--dtype", "float32", "--max-tokens", "512",
                             "--no-decode", "--no-loop", "--modes", "", "--train-run-minutes", "0.1",
                             "--train-run-pairs", "2000", "--train-run-vocab", "600", "--peak-tflops", "1",
                             "--output", str(output)])[:2]
    assert run["what"] == "train_run" and "error" not in run, run
    assert run["dtype"] == "float32" and run["vocab_size"] >= 600 and run["updates"] > 0
    assert 24 < run["mean_target_tokens"] < 34  # WMT-like after the run's BPE: about a token a word
    # The budget of 6 s stopped training (the bound of 1,000,000 updates did not).
    assert 0.9 * 6 <= run["train_runtime"] < 6 + 10  # a step or two past it on a busy machine
    assert run["target_tokens_per_second"] == pytest.approx(run["train_target_tokens"] / run["train_runtime"], rel=1e-3)
    # Per target token: the mean pair's FLOPs (flops.py on mean lengths), but for the quadratic attention terms.
    mean = training_flops_per_target_token(VanillaTransformerConfig.from_preset("tiny", vocab_size=run["vocab_size"]),
                                               run["mean_source_tokens"], run["mean_target_tokens"])
    assert run["flops_per_target_token"] == pytest.approx(mean, rel=0.05)
    assert run["mfu"] == pytest.approx(run["target_tokens_per_second"] * run["flops_per_target_token"] / 1e12)
    table = output.with_suffix(".md").read_text()
    assert "train.py tiny float32, 0.1 min on synthetic WMT-like text" in table and "MFU" in table


def test_ctranslate2_decodes_the_same_sentences_to_the_same_hypotheses(tmp_path):
    """In float32 on the CPU, CTranslate2 holding our weights finds generate()'s beam-4 hypotheses."""
    pytest.importorskip("ctranslate2")
    output = tmp_path / "gpu.json"
    results = gpu.main(["--device", "cpu", "--presets", "", "--modes", "eager", "--dtype", "float32",
                        "--vocab-size", "1000", "--decode-presets", "tiny", "--decode-batch", "6",
                        "--decode-tokens", "5",
                        "--decode-repeats", "1", "--no-loop", "--no-train-run", "--output", str(output)])
    machine, decoding = results
    ct2 = decoding["ctranslate2"]
    assert "skipped" not in ct2, ct2
    assert ct2["compute_type"] == "float32" and ct2["sentences"] == 6 and ct2["sentences_per_second"] > 0
    assert ct2["equal_to_ours"] == 6
    assert ct2["ours_over_ctranslate2"] == pytest.approx(decoding["sentences_per_second"] / ct2["sentences_per_second"])
    assert "decoding tiny eager, beam 4, CTranslate2" in output.with_suffix(".md").read_text()


def refuse_export(*args, **kwargs):
    raise ValueError("CTranslate2 has no activation_function 'tanh'")


@pytest.mark.parametrize("case", ["not importable", "export fails"])
def test_decoding_without_ctranslate2_says_why_and_measures_the_rest(case, monkeypatch):
    import sys

    import vanilla_transformer.convert

    if case == "not importable":
        monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` raises ImportError
    else:
        pytest.importorskip("ctranslate2")
        monkeypatch.setattr(vanilla_transformer.convert, "to_ctranslate2", refuse_export)
    machine, decoding = gpu.main(["--device", "cpu", "--presets", "", "--modes", "eager", "--dtype", "float32",
                                  "--vocab-size", "1000", "--decode-presets", "tiny", "--decode-batch", "2",
                                  "--decode-tokens", "2", "--decode-repeats", "1", "--no-loop", "--no-train-run"])
    assert decoding["sentences_per_second"] > 0 and decoding["marian_sentences_per_second"] > 0
    skipped = decoding["ctranslate2"]["skipped"]
    if case == "not importable":
        assert skipped.startswith("ctranslate2 is not importable") and "vanilla-transformer[ctranslate2]" in skipped
    else:
        assert skipped == "export to or loading in CTranslate2 failed: ValueError: CTranslate2 has no activation_function 'tanh'"
    assert f"CTranslate2 | skipped: {skipped} |" in gpu.markdown_table([machine, decoding])
