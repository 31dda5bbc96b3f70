"""benchmarks/operator_count.py: the operators (kernels on a GPU) and host reads of an update and a decoding step,
counted without a GPU; the counters checked against operations written out here."""

import pytest
import torch

import operator_count


def test_the_counter_sees_each_operator_and_leaves_views_and_allocations_out():
    with operator_count.Count() as count:
        a, b = torch.ones(2, 3), torch.ones(3, 2)
        (a @ b).t().unsqueeze(0).sum()
        torch.empty_like(a), a.new_empty(4), torch.empty(5)
    assert count.operators["aten.mm"] == 1 and count.operators["aten.ones"] == 2 and count.operators["aten.sum"] == 1
    assert count.operators["aten.empty_like"] == 1 and count.operators["aten.new_empty"] == 1
    assert count.kernels() == 4  # the transpose, the view and the allocations launch nothing


def test_each_read_of_a_value_on_the_host_is_counted():
    reads = []
    with operator_count.counted_reads(reads):
        value = torch.tensor([1.0, 2.0])
        bool(value[0]), value[1].item(), value.tolist(), int(value[0]), float(value[1])
    assert len(reads) == 5
    bool(value[0])  # outside the block: not counted
    assert len(reads) == 5


@pytest.fixture(scope="module")
def tiny():
    return {
        dtype: operator_count.main(
            ["--presets", "tiny", "--vocab-size", "300", "--rows", "6", "--source", "7", "--target", "5"]
            + ["--decode-rows", "3", "--decode-tokens", "4", "--dtype", dtype]
        )[0]
        for dtype in ("float32", "bfloat16")
    }


def test_an_update_and_a_decoding_step_are_counted_for_ours_and_marian(tiny):
    result = tiny["bfloat16"]
    update = result["update"]
    for name in ("ours", "ours, --fuse_projections", "marian", "ours, --bf16_weights", "ours, --sync_free_step"):
        phases = update[name]
        assert all(phases[p]["operators"] > 0 for p in ("forward", "loss", "backward", "optimizer")), phases
        parts = sum(phases[p]["operators"] for p in ("forward", "loss", "backward", "optimizer"))
        assert phases["update"]["operators"] == parts
    # the masks' two reads (transformers' check for an unpadded batch) and the loss's one, none with the lever
    assert update["ours"]["update"]["host_reads"] == 3
    assert update["ours, --sync_free_step"]["update"]["host_reads"] == 0
    # one product for the projections of one input: fewer operators forward and backward
    assert update["ours, --fuse_projections"]["forward"]["operators"] < update["ours"]["forward"]["operators"]
    assert update["ours, --fuse_projections"]["backward"]["operators"] < update["ours"]["backward"]["operators"]
    for name in ("ours", "marian"):
        decoding = result["decoding"][name]
        assert decoding["decoder_calls"] >= 4 and decoding["operators_per_step"] > 0
    assert result["decoding"]["ours"]["host_reads_per_step"] <= result["decoding"]["marian"]["host_reads_per_step"]


def test_dropout_and_the_loss_are_counted_as_a_gpu_runs_them():
    """On CUDA dropout is one fused kernel a call (``native_dropout``) and the loss one chunk of rows; on a CPU the
    package draws dropout's mask and applies it in four operators and goes a cache-sized chunk at a time. Each
    dropout module of the tiny model runs once forward: the CPU's path counts three more operators for each, and
    its loss more operators than one chunk's."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from vanilla_transformer.training_kernels import UniformMaskDropout

    argv = ["--presets", "tiny", "--vocab-size", "30000", "--rows", "6", "--source", "7", "--target", "5"]
    argv += ["--decode-rows", "2", "--decode-tokens", "2", "--dtype", "float32"]
    gpu, cpu = (operator_count.main(argv + extra)[0]["update"]["ours"] for extra in ([], ["--cpu-paths"]))
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=300))
    dropouts = sum(type(module) is UniformMaskDropout and module.p > 0 for module in model.modules())
    assert cpu["forward"]["operators"] - gpu["forward"]["operators"] == 3 * dropouts
    assert cpu["loss"]["operators"] > gpu["loss"]["operators"]  # 30 rows of 30,000: several chunks of 2^18


def test_autocasts_casts_are_among_the_conversions_counted_apart(tiny):
    """``aten._to_copy``, counted apart: under bfloat16 autocast each linear layer's weight is cast at least once
    forward (the rest are the masks' conversions to bool, as in float32), and gradients cast back."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=300))
    linear_layers = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    plain, autocast = tiny["float32"]["update"]["ours"], tiny["bfloat16"]["update"]["ours"]
    assert autocast["forward"]["casts"] - plain["forward"]["casts"] >= linear_layers
    assert plain["backward"]["casts"] == 0 and autocast["backward"]["casts"] >= linear_layers
    weights = tiny["bfloat16"]["update"]["ours, --bf16_weights"]  # no autocast: the float32 run's conversions
    assert weights["forward"]["casts"] == plain["forward"]["casts"] and weights["backward"]["casts"] == 0
    # the float32 masters: one multi-tensor copy each way around fused AdamW's step
    assert weights["optimizer"]["operators"] == autocast["optimizer"]["operators"] + 2
    assert "ours, --bf16_weights" not in tiny["float32"]["update"]
