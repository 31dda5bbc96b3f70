"""benchmarks/prepacked_weights.py at a tiny size: it times generate() with the opt-in prepacked weights on and
off, the switch really changes which kernels multiply, and the outputs it calls identical are."""

from __future__ import annotations

import pytest
import torch

from helpers import counted_kernels, load_script

benchmark = load_script("benchmarks/prepacked_weights.py")
TINY = ["--d-model", "16", "--ffn", "32", "--layers", "1", "--heads", "2", "--vocab", "300", "--repeats", "1"]


def test_each_batch_and_length_gets_a_row_with_identical_outputs(capsys):
    rows = benchmark.main([*TINY, "--batches", "1,3", "--new-tokens", "2,5", "--processor"])
    assert [(row["batch"], row["new_tokens"], row["decoded"]) for row in rows] == [
        (1, 2, 2),
        (1, 5, 5),
        (3, 2, 2),
        (3, 5, 5),
    ]
    assert all(row["identical"] and row["plain"] > 0 and row["prepacked"] > 0 for row in rows)
    printed = capsys.readouterr().out
    assert printed.count("| identical |") == 4 and "vocabulary 300" in printed and "with min_new_tokens" in printed


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_the_switch_decides_whether_the_prepacked_kernels_run():
    model = benchmark.VanillaTransformerForConditionalGeneration(
        benchmark.VanillaTransformerConfig(
            vocab_size=300,
            d_model=16,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
        )
    ).eval()
    input_ids = torch.randint(4, 300, (2, 6))
    calls = {}
    for flag in (True, False):
        with counted_kernels() as kernels:
            _, output = benchmark.timed_generate(model, input_ids, 4, flag, processor=True)
        calls[flag] = kernels["mkldnn::_linear_pointwise"]
        assert output.shape == (2, 1 + 4)  # exactly the new tokens asked for
    assert calls[False] == 0 and calls[True] == 4 * 3  # 4 steps x (FFN's two products + output projection)


def test_bad_settings_are_refused_before_any_model_is_built():
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--vocab", "3"])
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--new-tokens", ","])
