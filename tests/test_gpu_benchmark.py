"""benchmarks/gpu.py runs anywhere: on this CPU with a tiny model, its numbers add up."""

import json


from helpers import load_script

gpu = load_script("benchmarks/gpu.py")


def test_synthetic_lengths_look_like_wmt():
    lengths = gpu.synthetic_lengths(20000, seed=0)
    assert 24 < lengths.mean() < 32 and lengths.min() >= 2 and lengths.max() <= 250


def test_a_tiny_cpu_run_measures_training_and_decoding(tmp_path):
    output = tmp_path / "gpu.json"
    results = gpu.main(["--device", "cpu", "--presets", "tiny", "--modes", "eager", "--dtype", "bfloat16",
                        "--max-tokens", "512", "--warmup", "1", "--steps", "2", "--decode-batch", "3",
                        "--decode-tokens", "4", "--decode-repeats", "1", "--output", str(output)])
    machine, training, decoding = results
    assert machine["device"] == "cpu" and "error" not in training and "error" not in decoding
    assert training["steps"] == 2 and training["target_tokens_per_second"] > 0
    assert training["tokens_per_second"] > training["target_tokens_per_second"]
    assert training["padding_fraction"] < 0.1  # sorted token batches pad little
    assert decoding["new_tokens"] == 4 and decoding["sentences_per_second"] > 0
    assert json.loads(output.read_text()) == json.loads(json.dumps(results))
