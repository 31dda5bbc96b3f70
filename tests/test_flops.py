"""vanilla_transformer.training.flops against a hand count and against torch's own FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.flops import forward_flops, training_flops, training_flops_per_target_token


def test_a_hand_count_of_a_one_layer_model():
    # d=4, one layer each, 2 heads of 2, d_ff 8, vocabulary 10; one pair, 3 source and 2 target tokens.
    config = VanillaTransformerConfig(
        vocab_size=10,
        d_model=4,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=8,
        decoder_ffn_dim=8,
        max_position_embeddings=8,
    )
    encoder = 3 * 4 * (2 * 4 * 4) + 2 * (2 * 3 * 3 * 4) + 3 * (2 * 4 * 8) * 2  # projections, scores+sum, FFN
    decoder = (
        2 * 4 * (2 * 4 * 4)
        + 2 * (2 * 2 * 2 * 4)  # self-attention: 4 projections of 2 tokens, 2x2 scores
        + 2 * 2 * (2 * 4 * 4)
        + 2 * 3 * (2 * 4 * 4)  # cross: q, out of 2 target tokens; k, v of 3 source
        + 2 * (2 * 2 * 3 * 4)  # cross scores and sum: 2 target x 3 source
        + 2 * (2 * 4 * 8) * 2
    )  # FFN
    output = 2 * (2 * 4 * 10)
    assert forward_flops(config, [3], [2]) == encoder + decoder + output == 2064
    assert training_flops(config, [3], [2]) == 3 * 2064
    assert training_flops_per_target_token(config, 3, 2) == 3 * 2064 / 2


@pytest.mark.parametrize(
    "overrides",
    [{}, {"head_dim": 12, "decoder_layers": 3}, {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 200}],
)
def test_equals_torchs_flop_counter_on_a_forward_pass(overrides):
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=300, **overrides)
    model = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    source, target = torch.randint(4, 200, (3, 7)), torch.randint(4, 200, (3, 5))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=source, decoder_input_ids=target)
    assert forward_flops(config, [7] * 3, [5] * 3) == counter.get_total_flops()


def test_training_flops_equal_torchs_flop_counter_on_forward_and_backward():
    """training_flops counts a backward pass as twice the forward (the gradients of inputs and of weights);
    torch's counter over an actual forward and backward is the reference."""
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=300)
    model = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation="eager").train()
    source, target = torch.randint(4, 200, (3, 7)), torch.randint(4, 200, (3, 5))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=source, decoder_input_ids=target).logits.sum().backward()
    assert training_flops(config, [7] * 3, [5] * 3) == counter.get_total_flops()


def test_big_is_about_six_times_its_parameters_per_token():
    """The usual rule of thumb (6 N per token, attention aside) as a sanity check of the scale."""
    config = VanillaTransformerConfig.from_preset("big")
    model_parameters = 6 * 2 * 1024 * 1024 * 4 + 6 * 2 * 1024 * 4096 * 2 + 1024 * 37000  # layers + projection
    per_token = training_flops_per_target_token(config, 27, 28)
    assert 6 * model_parameters * 0.9 < per_token < 6 * model_parameters * 1.3


def test_matmul_throughput_is_torchs_count_of_a_product_over_each_timed_product():
    """The machine probe's FLOP/s: torch's own FLOP count of one square product, over the clock's reading
    around each product (a clock that advances 0.25 s a reading), once per repeat."""
    from vanilla_transformer.training.flops import matmul_flops_per_second

    with FlopCounterMode(display=False) as counter:
        torch.randn(16, 16) @ torch.randn(16, 16)
    readings = iter(range(100))
    flops = matmul_flops_per_second(16, 3, clock=lambda: 0.25 * next(readings), warmup_seconds=0.5)
    assert flops == [counter.get_total_flops() / 0.25] * 3
    assert next(readings) == 3 + 6  # warm-up: a start and two checks (0.25 s, 0.5 s); then two readings per product
