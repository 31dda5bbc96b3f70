"""The model against the paper and against independent implementations.

References used here: the formulas of §3.5 and §3.4, PyTorch's own `nn.TransformerEncoderLayer` /
`nn.TransformerDecoderLayer` (post-LN and pre-LN), the full forward pass (for the cache), one-by-one
generation (for batching), a plain cross-entropy (for the loss), and one large batch (for gradient
accumulation through the real Trainer).
"""

import json
import logging
import math
import os
import shutil

import pytest
import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.generation_vanilla_transformer import CACHE

VOCAB = 60


def tiny_config(**overrides) -> VanillaTransformerConfig:
    defaults = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=48,
        max_position_embeddings=128,
        dropout=0.0,
    )
    return VanillaTransformerConfig(**{**defaults, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def source_batch(seed: int = 1):
    """Two sources, the second padded on the right: ids avoid the special ids 0-3."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:] = 0
    attention_mask[1, 6:] = 0
    return input_ids, attention_mask


# --- §3.5 positions and §3.4 embeddings ---------------------------------------------------------


def test_sinusoidal_table_equals_the_formula_of_section_3_5():
    model = tiny_model()
    table = model.model.encoder.embedding.positional_encoding.table
    d = model.config.d_model
    for pos in (0, 1, 7, 50, 127):
        for i in (0, 1, 5, d // 2 - 1):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_stack_input_is_token_embedding_times_sqrt_d_model_plus_position(stack):
    """§3.4-3.5, both stacks (the decoder's was checked only through the encoder's code path)."""
    model = tiny_model()
    input_ids, _ = source_batch()
    embedded = getattr(model.model, stack).embedding(input_ids, None)
    weight = model.model.shared.weight
    d = model.config.d_model
    for pos in (0, 3, 8):
        angles = pos / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten().float()  # interleaved sin, cos
        expected = weight[input_ids[0, pos]] * math.sqrt(d) + pe
        torch.testing.assert_close(embedded[0, pos], expected)


def test_padding_row_of_the_shared_embedding_starts_at_zero():
    model = tiny_model()
    assert torch.count_nonzero(model.model.shared.weight[model.config.pad_token_id]) == 0


def linear_weights(model) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not model.model.shared.weight]


@pytest.mark.parametrize(
    "linear_init_std, expected_std", [(None, math.sqrt(2 / (5 * 64))), (0.02, 0.02)], ids=["small-init", "given"]
)
def test_linear_weights_start_normal_with_linear_init_std_and_biases_at_zero(linear_init_std, expected_std):
    """By default Nguyen & Salazar's (2019) small init, N(0, sqrt(2 / (5 d_model))), for every linear."""
    model = tiny_model(d_model=64, encoder_ffn_dim=256, decoder_ffn_dim=256, linear_init_std=linear_init_std)
    for weight in linear_weights(model):
        assert weight.std().item() == pytest.approx(expected_std, rel=0.1)
    weights = torch.cat([w.flatten() for w in linear_weights(model)])
    assert weights.numel() > 50_000
    assert weights.std().item() == pytest.approx(expected_std, rel=0.02)
    assert weights.mean().abs().item() < 4 * expected_std / weights.numel() ** 0.5
    # a normal distribution has ~0.27% of its mass beyond 3 sigma; a uniform one none
    assert 0.001 < (weights.abs() > 3 * expected_std).float().mean().item() < 0.006
    biases = [m.bias for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None]
    assert biases and all(torch.count_nonzero(b) == 0 for b in biases)


def test_linear_init_xavier_uniform_is_glorot_per_layer():
    model = tiny_model(d_model=64, encoder_ffn_dim=256, decoder_ffn_dim=256, linear_init="xavier_uniform")
    for weight in linear_weights(model):
        fan_out, fan_in = weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))  # Glorot & Bengio (2010), eq. 16
        assert weight.abs().max().item() <= bound
        assert weight.abs().max().item() > 0.9 * bound
        assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_token_embeddings_start_with_std_d_model_to_the_minus_half_whatever_the_linears():
    for linear_init in ("normal", "xavier_uniform"):
        model = tiny_model(d_model=64, vocab_size=4000, linear_init=linear_init)
        assert model.model.shared.weight[1:].std().item() == pytest.approx(64**-0.5, rel=0.03)


def copy_task_loss_after_training(seed: int = 0, steps: int = 120, **overrides) -> float:
    """Held-out loss of a d_model 32 model trained `steps` Adam updates (lr 4e-3) to copy 2-7 random tokens."""

    def batch(generator, size=32):
        lengths = torch.randint(2, 8, (size,), generator=generator).tolist()
        ids = torch.zeros(size, 8, dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(4, 16, (length,), generator=generator)
            ids[row, length] = 3  # </s>
        return ids, (ids != 0).long(), ids.masked_fill(ids == 0, -100)

    model = tiny_model(seed, encoder_layers=2, decoder_layers=2, decoder_ffn_dim=64, **overrides).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=4e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        input_ids, attention_mask, labels = batch(generator)
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    input_ids, attention_mask, labels = batch(torch.Generator().manual_seed(1000 + seed), 256)
    with torch.no_grad():
        return model.eval()(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.item()


def test_default_small_init_learns_a_copy_task_faster_than_xavier_and_a_fixed_0_02():
    """Why small init is the default: at d_model 32 a fixed std of 0.02 (BART's, MarianMT's) barely
    learns in 120 updates, Xavier-uniform does, and sqrt(2 / (5 d_model)) does better still."""
    small = copy_task_loss_after_training()
    xavier = copy_task_loss_after_training(linear_init="xavier_uniform")
    fixed = copy_task_loss_after_training(linear_init_std=0.02)
    assert small < xavier < fixed
    assert small < 0.8 < 1.5 < fixed  # unigram guessing of 12 tokens costs ~log(13) = 2.6


@pytest.mark.parametrize("value", [0, -0.02])
def test_non_positive_linear_init_std_is_an_error(value):
    with pytest.raises(Exception, match="linear_init_std must be positive and finite, or None"):
        tiny_config(linear_init_std=value)


def test_linear_init_std_with_xavier_uniform_is_an_error_not_ignored():
    with pytest.raises(Exception, match="linear_init_std=0.02 has no effect with linear_init='xavier_uniform'"):
        tiny_config(linear_init="xavier_uniform", linear_init_std=0.02)


def test_an_untied_output_projection_starts_like_every_other_linear():
    model = tiny_model(d_model=64, vocab_size=4000, tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.shared.weight
    assert model.lm_head.weight.std().item() == pytest.approx(math.sqrt(2 / (5 * 64)), rel=0.02)
    assert model.model.shared.weight[1:].std().item() == pytest.approx(64**-0.5, rel=0.03)


def test_a_config_saved_before_the_init_fields_existed_loads_with_small_init(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for key in ("linear_init", "linear_init_std"):
        del saved[key]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert (config.linear_init, config.linear_init_std) == ("normal", None)


def test_unknown_linear_init_is_an_error_naming_the_choices():
    with pytest.raises(Exception, match=r"Unknown linear_init 'kaiming'.*'normal', 'xavier_uniform'"):
        tiny_config(linear_init="kaiming")


# --- the whole forward pass against PyTorch's own Transformer layers ----------------------------


def torch_reference_logits(model, input_ids, attention_mask, decoder_input_ids, normalize_before):
    """The same weights run through `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer`."""
    config = model.config

    def copy_attention(torch_attention, ours):
        torch_attention.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        torch_attention.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        torch_attention.out_proj.load_state_dict(ours.out_proj.state_dict())

    def copy_ffn(torch_layer, ours):
        torch_layer.linear1.load_state_dict(ours.fc1.state_dict())
        torch_layer.linear2.load_state_dict(ours.fc2.state_dict())

    def embed(stack, ids):
        return stack.embedding(ids, None)  # checked against the formula above

    with torch.no_grad():
        memory = embed(model.model.encoder, input_ids)
        for ours in model.model.encoder.layers:
            layer = nn.TransformerEncoderLayer(
                config.d_model,
                config.encoder_attention_heads,
                config.encoder_ffn_dim,
                dropout=0.0,
                batch_first=True,
                norm_first=normalize_before,
            ).eval()
            copy_attention(layer.self_attn, ours.self_attention)
            copy_ffn(layer, ours.feed_forward)
            layer.norm1.load_state_dict(ours.self_attention_residual.layer_norm.state_dict())
            layer.norm2.load_state_dict(ours.feed_forward_residual.layer_norm.state_dict())
            memory = layer(memory, src_key_padding_mask=attention_mask == 0)
        if normalize_before:
            memory = model.model.encoder.layer_norm(memory)

        target = embed(model.model.decoder, decoder_input_ids)
        causal = nn.Transformer.generate_square_subsequent_mask(decoder_input_ids.shape[1])
        for ours in model.model.decoder.layers:
            layer = nn.TransformerDecoderLayer(
                config.d_model,
                config.decoder_attention_heads,
                config.decoder_ffn_dim,
                dropout=0.0,
                batch_first=True,
                norm_first=normalize_before,
            ).eval()
            copy_attention(layer.self_attn, ours.self_attention)
            copy_attention(layer.multihead_attn, ours.cross_attention)
            copy_ffn(layer, ours.feed_forward)
            layer.norm1.load_state_dict(ours.self_attention_residual.layer_norm.state_dict())
            layer.norm2.load_state_dict(ours.cross_attention_residual.layer_norm.state_dict())
            layer.norm3.load_state_dict(ours.feed_forward_residual.layer_norm.state_dict())
            target = layer(target, memory, tgt_mask=causal, memory_key_padding_mask=attention_mask == 0)
        if normalize_before:
            target = model.model.decoder.layer_norm(target)
        return target @ model.model.shared.weight.T  # §3.4: the projection is the shared embedding


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_logits_equal_pytorch_transformer_layers_with_the_same_weights(normalize_before, attn_implementation):
    model = tiny_model(normalize_before=normalize_before)
    model.set_attn_implementation(attn_implementation)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(4, VOCAB, (2, 6))
    ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    reference = torch_reference_logits(model, input_ids, attention_mask, decoder_input_ids, normalize_before)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_post_ln_stacks_have_no_final_layer_norm_and_pre_ln_stacks_do():
    assert isinstance(tiny_model().model.encoder.layer_norm, nn.Identity)
    pre = tiny_model(normalize_before=True).model
    assert isinstance(pre.encoder.layer_norm, nn.LayerNorm) and isinstance(pre.decoder.layer_norm, nn.LayerNorm)


def test_dropout_is_active_in_training_and_off_in_eval():
    model = tiny_model(dropout=0.3)
    input_ids, attention_mask = source_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4])
    eval_a, eval_b = model(**inputs).logits, model(**inputs).logits
    assert torch.equal(eval_a, eval_b)
    model.train()
    assert not torch.allclose(model(**inputs).logits, model(**inputs).logits)


def test_training_drops_out_every_sub_layers_output_and_both_embedding_sums():
    """§5.4: dropout "to the output of each sub-layer, before it is added to the sub-layer input and normalized"
    and "to the sums of the embeddings and the positional encodings in both the encoder and decoder stacks":
    2 per encoder layer, 3 per decoder layer, 1 per stack. Each zeroes about p of its entries (5 standard
    deviations of the binomial) and scales the rest by 1 / (1 - p)."""
    p, model = 0.3, tiny_model(dropout=0.3).train()
    seen = []

    def record(module, inputs, output):
        kept = output != 0
        seen.append((1 - kept.float().mean().item(), output.numel()))
        torch.testing.assert_close(output[kept], inputs[0][kept] / (1 - p))

    for name, module in model.named_modules():
        if name.endswith(".dropout"):  # the embeddings' and the residual connections' (not the FFN's own)
            module.register_forward_hook(record)
    input_ids, attention_mask = source_batch()
    model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4])
    config = model.config
    assert len(seen) == (1 + 2 * config.encoder_layers) + (1 + 3 * config.decoder_layers) == 15
    for dropped, count in seen:
        assert abs(dropped - p) <= 5 * math.sqrt(p * (1 - p) / count), (dropped, count)


# --- §3.2.3 masking -----------------------------------------------------------------------------


def test_decoder_is_causal_a_later_target_token_never_changes_earlier_logits():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(4, VOCAB, (2, 7))
    changed = decoder_input_ids.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (VOCAB - 4) + 4
    before = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    after = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(before[:, :4], after[:, :4], atol=0, rtol=0)
    assert (before[:, 4:] - after[:, 4:]).abs().amax(dim=-1).min() > 0  # every later position sees it


def test_encoder_is_bidirectional_a_source_token_changes_every_position():
    model = tiny_model()
    input_ids = torch.randint(4, VOCAB, (1, 8))
    changed = input_ids.clone()
    changed[0, 5] = (changed[0, 5] + 1 - 4) % (VOCAB - 4) + 4
    before = model.model.encoder(input_ids=input_ids).last_hidden_state
    after = model.model.encoder(input_ids=changed).last_hidden_state
    assert (before - after).abs().amax(dim=-1).min() > 1e-6  # positions before and after 5 alike


def test_padding_in_the_source_does_not_change_the_result():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(4, VOCAB, (1, 5))
    padded = model(input_ids=input_ids[1:], attention_mask=attention_mask[1:], decoder_input_ids=decoder_input_ids)
    unpadded = model(input_ids=input_ids[1:, :6], decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(padded.logits, unpadded.logits, atol=1e-5, rtol=1e-5)


# --- attention backends ---------------------------------------------------------------------------


def flex_attention_runs() -> bool:
    """Whether flex attention can run here: its compiled CPU kernel needs a C++ compiler. Where there is one,
    flex attention must work: its errors fail the tests instead of skipping them."""
    return any(shutil.which(compiler) for compiler in (os.environ.get("CXX") or "c++", "g++", "clang++"))


# torch 2.13's CPU flex attention kernel, once torch.compile recompiles it for dynamic shapes (its default at a
# second shape), fails for some shapes ("index out of bounds ... cur_qSplitSize", or C++ that does not compile)
# with or without shared encoder outputs: the flex tests compile each shape on its own and never fall back.
static_shapes = torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64)


@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention"])
@static_shapes
@torch.no_grad()
def test_attention_backends_agree_with_eager_on_padded_batches(implementation):
    if implementation == "flex_attention" and not flex_attention_runs():
        pytest.skip("flex attention compiles a C++ kernel on the CPU: no C++ compiler found")
    input_ids, attention_mask = source_batch()
    inputs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=torch.randint(4, VOCAB, (2, 6)),
        decoder_attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]),
    )
    model = tiny_model()
    model.set_attn_implementation("eager")
    eager = model(**inputs).logits
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    other = model(**inputs).logits
    # compare where the decoder is not padded
    torch.testing.assert_close(other[0], eager[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(other[1, :4], eager[1, :4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("target_length", [1, 5])
@torch.no_grad()
def test_an_encoder_output_shared_by_several_decodings_equals_it_repeated_for_each(implementation, target_length):
    # three decodings of each source: the decoder gets the encoder output once per source (2 rows) and its
    # own input in 6 rows; the reference repeats the encoder output and the source mask for every decoding
    model = tiny_model()
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = source_batch()
    encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    decoder_input_ids = torch.randint(4, VOCAB, (6, target_length), generator=torch.Generator().manual_seed(3))
    shared = model(
        encoder_outputs=(encoder_output,),
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=implementation == "eager",
    )
    repeated = model(
        encoder_outputs=(encoder_output.repeat_interleave(3, dim=0),),
        attention_mask=attention_mask.repeat_interleave(3, dim=0),
        decoder_input_ids=decoder_input_ids,
        output_attentions=implementation == "eager",
    )
    torch.testing.assert_close(shared.logits, repeated.logits, atol=1e-5, rtol=1e-5)
    if implementation == "eager":
        for ours, reference in zip(shared.cross_attentions, repeated.cross_attentions, strict=True):
            assert ours.shape == (6, 4, target_length, 9)
            torch.testing.assert_close(ours, reference)


@pytest.mark.parametrize("kernel", ["unfused", pytest.param("compiled", marks=pytest.mark.slow)])  # ~30 s a case
@pytest.mark.parametrize("padded", [True, False], ids=["padded source", "unpadded source"])
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@static_shapes
@torch.no_grad()
def test_flex_attention_shares_an_encoder_output_as_if_it_were_repeated(padded, kernel):
    """Flex attention's mask is a BlockMask (a mask function), not a tensor to repeat. Three decodings of each
    source: three target tokens at once, then one more with the cache of those three, against the same calls with
    the encoder output and the source mask repeated for every decoding. "unfused" runs flex attention's PyTorch
    reference (torch.compile's force_eager stance), "compiled" its fused CPU kernel."""
    if kernel == "compiled" and not flex_attention_runs():
        pytest.skip("flex attention compiles a C++ kernel on the CPU: no C++ compiler found")
    model = tiny_model()
    model.set_attn_implementation("flex_attention")
    input_ids, attention_mask = source_batch()
    if not padded:
        attention_mask = torch.ones_like(attention_mask)
    decoder_input_ids = torch.randint(4, VOCAB, (6, 4), generator=torch.Generator().manual_seed(3))

    def decode(encoder_output, attention_mask):
        first = model(
            encoder_outputs=(encoder_output,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, :3],
            use_cache=True,
        )
        second = model(
            encoder_outputs=(encoder_output,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, 3:],
            use_cache=True,
            **{CACHE: getattr(first, CACHE)},
        )
        return torch.cat([first.logits, second.logits], dim=1)

    with torch.compiler.set_stance("force_eager" if kernel == "unfused" else "default"):
        encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        shared = decode(encoder_output, attention_mask)
        repeated = decode(encoder_output.repeat_interleave(3, dim=0), attention_mask.repeat_interleave(3, dim=0))
    torch.testing.assert_close(shared, repeated, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decoder_rows", [1, 5])  # fewer rows than sources; not a whole number per source
def test_decoder_rows_that_do_not_divide_among_the_sources_are_an_error(decoder_rows):
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    with pytest.raises(ValueError, match=f"decoder input has {decoder_rows} rows and the encoder output 2"):
        model(
            encoder_outputs=(encoder_output,),
            attention_mask=attention_mask,
            decoder_input_ids=torch.randint(4, VOCAB, (decoder_rows, 3)),
        )


def test_attn_implementation_is_selectable_when_building():
    config = tiny_config()
    model = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"


# --- output_attentions / output_hidden_states -----------------------------------------------------


def test_attention_outputs_are_distributions_that_ignore_source_padding():
    model = tiny_model()
    model.set_attn_implementation("eager")
    input_ids, attention_mask = source_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=torch.randint(4, VOCAB, (2, 5)),
        output_attentions=True,
    )
    config = model.config
    assert len(out.encoder_attentions) == config.encoder_layers
    assert len(out.decoder_attentions) == len(out.cross_attentions) == config.decoder_layers
    assert out.encoder_attentions[0].shape == (2, 4, 9, 9)
    assert out.decoder_attentions[0].shape == (2, 4, 5, 5)
    assert out.cross_attentions[0].shape == (2, 4, 5, 9)
    for weights in (*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    for weights in out.cross_attentions:
        assert torch.all(weights[1, :, :, 6:] == 0)  # padded source positions get no attention
    for weights in out.decoder_attentions:
        assert torch.all(weights.triu(diagonal=1) == 0)  # no attention to the future


def test_hidden_states_has_one_entry_per_layer_plus_embeddings():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=input_ids[:, :4],
        output_hidden_states=True,
    )
    assert len(out.encoder_hidden_states) == model.config.encoder_layers + 1
    assert len(out.decoder_hidden_states) == model.config.decoder_layers + 1
    torch.testing.assert_close(out.encoder_hidden_states[0], model.model.encoder.embedding(input_ids, None))
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


# --- the key/value cache --------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["cache", "past_key_values"])  # transformers 5.24's name, and the one before
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-LN", "pre-LN"])
def test_incremental_decoding_with_the_cache_equals_the_full_forward_step_by_step(normalize_before, argument):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(4, VOCAB, (2, 7))
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    past = None
    for step in range(decoder_input_ids.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            **{argument: past},
            decoder_input_ids=decoder_input_ids[:, step : step + 1],
            use_cache=True,
        )
        past = getattr(out, CACHE)  # the output field has the installed transformers' name
        torch.testing.assert_close(out.logits[:, 0], full[:, step], atol=1e-5, rtol=1e-5)
    assert past.get_seq_length() == decoder_input_ids.shape[1]
    # cross-attention keys/values were projected once, at the first step, from the whole source
    assert past.cross_attention_cache.layers[0].keys.shape[2] == input_ids.shape[1]


def test_passing_the_cache_under_both_names_is_an_error():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with pytest.raises(ValueError, match="once"):
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=input_ids[:, :1],
            cache=cache,
            past_key_values=cache,
        )


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_decodes_with_the_logits_of_a_forward_over_its_whole_output(num_beams):
    """generate() passes the cache under the installed transformers' name (`cache` from 5.24,
    `past_key_values` before). Were it lost, every step would decode at position 0 with no past:
    the logits it chose each token from must be those of one uncached forward over its output."""
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=10,
        min_new_tokens=10,
        output_logits=True,
        return_dict_in_generate=True,
    )
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=out.sequences[:, :-1]).logits
    assert len(out.logits) == full.shape[1] == 10
    for step, logits in enumerate(out.logits):  # (rows, V): with beams, the row each hypothesis came from
        decoded = logits if num_beams == 1 else logits[out.beam_indices[:, step]]
        torch.testing.assert_close(decoded, full[:, step], atol=1e-4, rtol=1e-4)


GENERATION_CASES = {
    "greedy": dict(num_beams=1, do_sample=False, max_new_tokens=12),
    "beam4": dict(num_beams=4, num_return_sequences=3, max_new_tokens=12),
}


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_generation_is_identical_with_dynamic_cache_static_cache_and_no_cache(case):
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, **GENERATION_CASES[case])
    without = model.generate(**settings, use_cache=False)
    dynamic = model.generate(**settings, use_cache=True)
    static = model.generate(**settings, cache_implementation="static")
    assert torch.equal(without, dynamic)
    assert torch.equal(without, static)


def test_a_static_cache_asked_for_in_the_call_is_used_without_transformers_deprecation_warning(caplog):
    """generate(cache_implementation="static") under the paper's length rule: our copy of the generation config
    takes the call's settings, and transformers warns ("Passing `generation_config` together with
    generation-related arguments ... is deprecated") about any left in the call. The cache it builds is static."""
    from transformers import StaticCache
    from transformers.utils import logging as transformers_logging

    model = tiny_model()
    input_ids, attention_mask = source_batch()
    transformers_logging.get_logger("transformers").warning_once.cache_clear()  # a warning said once a process
    with caplog.at_level(logging.WARNING):
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_beams=2,
            cache_implementation="static",
            return_dict_in_generate=True,
        )
    assert "is deprecated" not in caplog.text
    assert isinstance(out.past_key_values.self_attention_cache, StaticCache)


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_batched_generation_with_padding_equals_one_by_one(case):
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    settings = GENERATION_CASES[case]
    batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    per_row = batched.shape[0] // 2
    for row, length in ((0, 9), (1, 6)):
        alone = model.generate(input_ids=input_ids[row : row + 1, :length], **settings)
        expected = batched[row * per_row : (row + 1) * per_row]
        pad = model.config.pad_token_id
        trimmed = expected[:, : alone.shape[1]]
        assert torch.equal(trimmed, alone)
        assert torch.all(expected[:, alone.shape[1] :] == pad)


def test_beam_search_defaults_are_the_papers():
    generation_config = tiny_model().generation_config
    assert generation_config.num_beams == 4
    assert generation_config.length_penalty == 0.6
    assert generation_config.early_stopping is True


def test_a_folder_without_generation_config_json_decodes_as_the_paper_does(tmp_path):
    """transformers builds a greedy config from config.json where the file is missing; §6.1 decodes with beam 4,
    alpha 0.6 and source + 50. A folder that has the file keeps what it says."""
    model = tiny_model()
    model.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.length_penalty, loaded.early_stopping) == (4, 0.6, True)
    assert (loaded.length_penalty_formula, loaded.max_new_tokens_beyond_input) == ("gnmt", 50)
    model.generation_config.num_beams = 2
    model.save_pretrained(tmp_path)
    assert VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config.num_beams == 2
    # a file written from a model config (a converted MarianMT's) is taken as written too
    written = json.loads((tmp_path / "generation_config.json").read_text())
    written.update(_from_model_config=True, num_beams=5, bad_words_ids=[[0]])
    (tmp_path / "generation_config.json").write_text(json.dumps(written))
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.bad_words_ids) == (5, [[0]])


def test_default_maximum_output_length_is_input_length_plus_50():
    model = tiny_model(seed=3)
    # make </s> impossible so that decoding runs to its limit
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))
    input_ids = torch.randint(4, VOCAB, (1, 7))
    out = model.generate(input_ids=input_ids, num_beams=1)
    assert out.shape[1] == 1 + 7 + 50  # start token + (input length + 50)
    limited = model.generate(input_ids=input_ids, num_beams=1, max_new_tokens=5)
    assert limited.shape[1] == 1 + 5


LENGTH_RULE_CASES = {
    "greedy": dict(num_beams=1),
    "beam4": dict(num_beams=4),  # BeamSearch
    "beam4, two returned": dict(num_beams=4, num_return_sequences=2),
    "beam4, transformers' loop": dict(num_beams=4, return_dict_in_generate=True),
}


@pytest.mark.parametrize("case", LENGTH_RULE_CASES)
def test_each_sentence_of_a_padded_batch_gets_its_own_input_length_plus_50(case):
    """§6.1's limit is the sentence's: in a batch padded to 9 tokens, sources of 4 and 6 tokens stop at
    4 + 50 and 6 + 50 new tokens, with the same tokens as each decoded alone, and without a </s>."""
    model = tiny_model(seed=3)
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))  # never ends
    input_ids = torch.randint(4, VOCAB, (3, 9), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    lengths = (9, 4, 6)
    for row, length in enumerate(lengths):
        input_ids[row, length:], attention_mask[row, length:] = 0, 0
    settings = LENGTH_RULE_CASES[case]
    batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    batched = batched if torch.is_tensor(batched) else batched.sequences
    per_sentence = batched.shape[0] // 3
    for row, length in enumerate(lengths):
        rows = batched[row * per_sentence : (row + 1) * per_sentence]
        alone = model.generate(input_ids=input_ids[row : row + 1, :length], **settings)
        alone = alone if torch.is_tensor(alone) else alone.sequences
        assert alone.shape[1] == 1 + length + 50
        assert torch.equal(rows[:, : alone.shape[1]], alone)
        assert torch.all(rows[:, alone.shape[1] :] == model.config.pad_token_id)
    assert not (batched == 3).any()


def never_ending_model(**overrides):
    model = tiny_model(seed=3, **overrides)
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))  # no </s>
    return model


def test_the_length_rule_survives_a_saved_generation_config_and_takes_the_calls_setting(tmp_path):
    """save_pretrained writes max_length = max_position_embeddings for other readers; passing the saved
    generation config back keeps input + 50. max_new_tokens_beyond_input in the call beats the config's."""
    from transformers import GenerationConfig

    model = never_ending_model()
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    reloaded.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))
    saved = GenerationConfig.from_pretrained(tmp_path)
    assert saved.max_length == model.config.max_position_embeddings > 1 + 5 + 50
    input_ids = torch.randint(4, VOCAB, (1, 5))
    for config in (None, reloaded.generation_config, saved):
        assert reloaded.generate(input_ids=input_ids, generation_config=config, num_beams=1).shape[1] == 1 + 5 + 50
    assert reloaded.generate(input_ids=input_ids, num_beams=1, max_new_tokens_beyond_input=10).shape[1] == 16
    switched_off = reloaded.generate(input_ids=input_ids, num_beams=1, max_new_tokens_beyond_input=None)
    assert switched_off.shape[1] == model.config.max_position_embeddings  # the saved max_length applies


@pytest.mark.parametrize("value", [-3, 2.5, "5", True])
def test_a_length_rule_that_is_not_a_whole_number_of_tokens_is_refused_naming_it(value):
    """-3 once cut a short source's output to fewer tokens than its start token; the others failed in torch."""
    model = never_ending_model()
    input_ids = torch.randint(4, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=f"max_new_tokens_beyond_input={value!r}: give a whole number"):
        model.generate(input_ids=input_ids, num_beams=1, max_new_tokens_beyond_input=value)
    model.generation_config.max_new_tokens_beyond_input = value
    with pytest.raises(ValueError, match="max_new_tokens_beyond_input="):
        model.generate(input_ids=input_ids, num_beams=1)
    model.generation_config.max_new_tokens_beyond_input = 0  # the source's length, no more
    assert model.generate(input_ids=input_ids, num_beams=1).shape[1] == 1 + 5


def test_max_new_tokens_on_a_saved_model_decodes_that_many_without_a_warning(tmp_path, caplog):
    """The saved max_length only caps the length rule: a call's max_new_tokens is not 'both set'."""
    from transformers.utils import logging as transformers_logging

    never_ending_model().save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    reloaded.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            out = reloaded.generate(input_ids=torch.randint(4, VOCAB, (1, 5)), num_beams=1, max_new_tokens=3)
    finally:
        transformers_logging.disable_propagation()
    assert out.shape[1] == 1 + 3
    assert not [r.getMessage() for r in caplog.records if "max_new_tokens" in r.getMessage()]


def test_a_decoder_prompt_does_not_eat_into_the_50_new_tokens():
    model = never_ending_model()
    input_ids = torch.randint(4, VOCAB, (1, 5))
    for prompt in (1, 4):
        decoder_input_ids = torch.full((1, prompt), model.config.decoder_start_token_id)
        out = model.generate(input_ids=input_ids, decoder_input_ids=decoder_input_ids, num_beams=1)
        assert out.shape[1] == prompt + 5 + 50


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_prompt_without_the_start_token_decodes_as_transformers_prepends_it(num_beams):
    """transformers puts the start token in front of a prompt that lacks it; the prompt was counted as given, so
    the last prompt token was taken for generated (a prompt ending in </s>, as tokenizer(text_target=...) makes
    one, then had every new token padded out) and the 50 new tokens were one short. The reference: the same
    prompt with the start token given."""
    model = never_ending_model()
    input_ids, start, eos = (
        torch.randint(4, VOCAB, (1, 5)),
        model.config.decoder_start_token_id,
        model.config.eos_token_id,
    )
    for prompt in ([9], [9, eos]):
        without = model.generate(input_ids=input_ids, decoder_input_ids=torch.tensor([prompt]), num_beams=num_beams)
        given = model.generate(
            input_ids=input_ids, decoder_input_ids=torch.tensor([[start, *prompt]]), num_beams=num_beams
        )
        assert torch.equal(without, given) and without.shape[1] == 1 + len(prompt) + 5 + 50, prompt
        assert (without[0, 1 + len(prompt) :] != model.config.pad_token_id).all()


def test_an_empty_batch_is_refused_in_words():
    """It failed inside the source-length helper with "min(): Expected reduction dim..."."""
    with pytest.raises(ValueError, match="a batch of 0 sources"):
        never_ending_model().generate(input_ids=torch.zeros(0, 5, dtype=torch.long))


def test_source_ids_outside_the_vocabulary_are_refused_in_words():
    """Another model's tokenizer gave ids past the embedding: an IndexError from inside the model (on a GPU a
    device-side assert that poisons the process). The ids a model has pass, given either way."""
    model = never_ending_model()
    rows = model.get_input_embeddings().num_embeddings
    for ids in ([[5, rows, 3]], [[5, -1, 3]]):
        with pytest.raises(ValueError, match=r"The source holds token id -?\d+, outside this model's vocabulary"):
            model.generate(input_ids=torch.tensor(ids), max_new_tokens=2)
        with pytest.raises(ValueError, match="another model's tokenizer"):
            model.generate(torch.tensor(ids), max_new_tokens=2)
    assert model.generate(input_ids=torch.tensor([[5, rows - 1, 3]]), max_new_tokens=2).shape[0] == 1


def test_forced_eos_with_the_per_sentence_limit_is_warned_about(caplog):
    """ForcedEOSTokenLogitsProcessor forces </s> at the batch's limit: a short sentence cut at its own limit in
    a batch ends without the </s> it gets decoded alone (the reference, shown here), which is said once."""
    from transformers.utils import logging as transformers_logging

    model = never_ending_model()
    model.generation_config.forced_eos_token_id = model.config.eos_token_id
    input_ids, attention_mask = source_batch()
    short = int(attention_mask.sum(dim=1).argmin())
    length = int(attention_mask[short].sum())
    alone = model.generate(input_ids=input_ids[short : short + 1, :length], num_beams=1)
    batch = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1)
    assert alone[0, -1] == model.config.eos_token_id and model.config.eos_token_id not in batch[short]
    transformers_logging.get_logger("vanilla_transformer.generation_vanilla_transformer").warning_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1)
    assert "forced_eos_token_id forces </s> at the batch's length limit" in caplog.text


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_model_that_starts_decoding_with_eos_keeps_its_output(num_beams):
    """fairseq's models start the decoder with </s>: the start token is not the end of the hypothesis."""
    model = never_ending_model(decoder_start_token_id=3)
    out = model.generate(input_ids=torch.randint(4, VOCAB, (1, 5)), num_beams=num_beams, max_new_tokens=6)
    assert out[0, 0] == 3 and (out[0, 1:] != model.config.pad_token_id).all()


def test_a_padded_source_without_attention_mask_is_decoded_as_with_one():
    """transformers infers the mask from <pad> for decoder-only models only; an encoder-decoder would
    attend to the padding and cut every sentence at the batch's limit."""
    model = never_ending_model()
    input_ids, attention_mask = source_batch()
    for num_beams in (1, 4):
        with_mask = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams)
        assert torch.equal(model.generate(input_ids=input_ids, num_beams=num_beams), with_mask)


def test_a_source_padded_on_the_left_is_refused():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    left_ids, left_mask = input_ids.clone(), attention_mask.clone()
    left_ids[1], left_mask[1] = input_ids[1].roll(3), attention_mask[1].roll(3)
    with pytest.raises(ValueError, match=r"1 source\(s\) are padded on the left .*padding_side = 'right'"):
        model.generate(input_ids=left_ids, attention_mask=left_mask, max_new_tokens=3)


# --- ending a translation: undertrained models loop -----------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_hypothesis_that_never_ends_reaches_the_limit_without_a_forced_eos(num_beams):
    """Loops stay visible: nothing puts </s> into the last slot. MarianConfig's default
    forced_eos_token_id does, which makes an undertrained MarianMT's loops look finished."""
    model = tiny_model(seed=3)
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), -1e9))
    input_ids, attention_mask = source_batch()
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=6)
    out = model.generate(**settings)
    assert out.shape[1] == 1 + 6 and not (out == 3).any()
    # the same check sees a forced </s>: the suppressed logit does not stop the forcing processor
    forced = model.generate(**settings, forced_eos_token_id=3)
    assert torch.all(forced[:, -1] == 3)


def test_generate_starts_the_decoder_with_the_token_that_training_starts_it_with():
    """A decoder trained from one start token and run from another is off its training distribution."""
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    training_start = model.prepare_decoder_input_ids_from_labels(torch.tensor([[5, 3]]))[0, 0]
    for num_beams in (1, 4):
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=2)
        assert torch.all(out[:, 0] == training_start)


WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


def copy_task_sentences(count: int, generator: torch.Generator) -> list[str]:
    return [
        " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(length),), generator=generator))
        for length in torch.randint(2, 7, (count,), generator=generator)
    ]


def test_a_model_trained_the_way_run_translation_py_trains_ends_its_translations(tmp_path):
    """The path of transformers' translation script, on a copy task: labels from
    ``tokenizer(text_target=...)``, ``DataCollatorForSeq2Seq(model=...)`` (decoder inputs from the
    labels), Seq2SeqTrainer with label smoothing, beam search with the model's generation config.
    After 200 updates every translation ends with </s> before the length limit (labels without
    their </s> fail here) and reproduces its source."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vanilla_transformer import train_tokenizer

    generator = torch.Generator().manual_seed(0)
    train, test = copy_task_sentences(200 * 32, generator), copy_task_sentences(100, generator)
    tokenizer = train_tokenizer(iter(train), vocab_size=300)
    model = tiny_model(vocab_size=len(tokenizer), decoder_layers=2, decoder_ffn_dim=64).train()

    def encode(sentences):  # as run_translation.py's preprocess_function: tokenizer(source, text_target=target)
        encoded = tokenizer(sentences, text_target=sentences)
        return [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=200,
        per_device_train_batch_size=32,
        learning_rate=4e-3,
        warmup_steps=30,
        label_smoothing_factor=0.1,
        predict_with_generate=True,
        per_device_eval_batch_size=100,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=encode(train),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    trainer.train()
    predictions = trainer.predict(encode(test)).predictions
    eos = tokenizer.eos_token_id
    assert all(eos in row[1:] for row in predictions.tolist())
    translations = tokenizer.batch_decode(predictions, skip_special_tokens=True)
    assert sum(t.strip() == s for t, s in zip(translations, test)) >= 90


# --- loss and training ---------------------------------------------------------------------------


def test_loss_is_mean_token_cross_entropy_ignoring_minus_100():
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    labels = torch.randint(4, VOCAB, (2, 6))
    labels[1, 4:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    log_probs = out.logits.log_softmax(-1)
    picked = [-log_probs[b, t, labels[b, t]] for b in range(2) for t in range(6) if labels[b, t] != -100]
    torch.testing.assert_close(out.loss, torch.stack(picked).mean())


def test_decoder_inputs_from_labels_are_start_token_then_labels_shifted_right():
    model = tiny_model()
    labels = torch.tensor([[11, 12, 13, 3], [21, 3, -100, -100]])
    expected = torch.tensor([[2, 11, 12, 13], [2, 21, 3, 0]])
    assert torch.equal(model.prepare_decoder_input_ids_from_labels(labels), expected)


@pytest.mark.floor
def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask = source_batch()
    labels = torch.randint(4, VOCAB, (2, 5))
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        if checkpointing:
            # transformers 5.23 renamed gradient_checkpointing_enable (kept, deprecated); older 5.x has only it
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
            layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            assert layers and all(layer.gradient_checkpointing for layer in layers)
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in gradients[0]:
        torch.testing.assert_close(gradients[0][name], gradients[1][name], atol=1e-6, rtol=1e-5)


def trainer_parameters_after_one_update(tmp_path, examples, batch_size, accumulation):
    """Run one optimiser step of the real Seq2SeqTrainer with SGD(lr=1) and return the parameters."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    model = tiny_model().train()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / f"run-{batch_size}-{accumulation}"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        train_sampling_strategy="sequential",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )

    def collate(batch):
        width = max(len(e["labels"]) for e in batch)
        labels = torch.tensor([e["labels"] + [-100] * (width - len(e["labels"])) for e in batch])
        return {"input_ids": torch.stack([e["input_ids"] for e in batch]), "labels": labels}

    Seq2SeqTrainer(model=model, args=args, train_dataset=examples, data_collator=collate).train()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.floor
def test_gradient_accumulation_of_two_steps_equals_one_double_batch_in_the_trainer(tmp_path):
    generator = torch.Generator().manual_seed(5)
    # target lengths differ between the micro-batches: a per-micro-batch mean would weight them wrongly
    lengths = [2, 2, 7, 7]
    examples = [
        {
            "input_ids": torch.randint(4, VOCAB, (6,), generator=generator),
            "labels": torch.randint(4, VOCAB, (n,), generator=generator).tolist(),
        }
        for n in lengths
    ]
    accumulated = trainer_parameters_after_one_update(tmp_path, examples, batch_size=2, accumulation=2)
    one_batch = trainer_parameters_after_one_update(tmp_path, examples, batch_size=4, accumulation=1)
    initial = {n: p.detach() for n, p in tiny_model().named_parameters()}
    assert not torch.equal(one_batch["model.shared.weight"], initial["model.shared.weight"])  # an update happened
    for name, value in one_batch.items():
        torch.testing.assert_close(accumulated[name], value, atol=1e-5, rtol=1e-4)


# --- variants of the paper ---------------------------------------------------------------------


def test_separate_vocabularies_give_target_sized_logits_and_untied_source_embedding():
    model = tiny_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=40)
    input_ids, attention_mask = source_batch()
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.randint(4, 40, (2, 3))
    ).logits
    assert logits.shape[-1] == 40
    assert model.model.decoder.embedding.token_embedding is not model.model.shared
    assert model.lm_head.weight is model.model.decoder.embedding.token_embedding.weight


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_head_dim_can_differ_from_d_model_over_heads(attn_implementation):
    """Table 3, rows B: d_k = 4 with 4 heads (16 wide) in a d_model of 32. The reference is Eq. (1) by hand, per
    head softmax(Q K^T / sqrt(d_k)) V, concatenated and projected: a scale of sqrt(d_model / h) = sqrt(8) instead
    of sqrt(d_k) = 2 gives other outputs."""
    model = tiny_model(head_dim=4, attn_implementation=attn_implementation)
    attention = model.model.encoder.layers[0].self_attention
    assert attention.q_proj.weight.shape == (16, 32) and attention.out_proj.weight.shape == (32, 16)
    states = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output, _ = attention(states)
        heads = [
            projection(states).unflatten(-1, (4, 4)).transpose(1, 2)
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj)
        ]  # (B, h, T, d_k) each
        query, key, value = heads
        weights = torch.softmax(query @ key.transpose(-1, -2) / math.sqrt(4), dim=-1)
        expected = attention.out_proj((weights @ value).transpose(1, 2).flatten(2))
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-5)
    input_ids, attention_mask = source_batch()
    model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)


def test_learned_positions_are_parameters_of_table_3_row_e():
    model = tiny_model(position_embedding_type="learned")
    names = [n for n, _ in model.named_parameters() if "positional_encoding" in n]
    assert len(names) == 2  # one table per stack


# --- bad input -------------------------------------------------------------------------------------


def test_sequence_longer_than_max_positions_is_an_error_not_a_truncation():
    model = tiny_model()
    with pytest.raises(ValueError, match="129 tokens in input_ids is longer than max_position_embeddings=128.*trunc"):
        model(input_ids=torch.full((1, 129), 5), decoder_input_ids=torch.full((1, 2), 5))
    with pytest.raises(
        ValueError, match=r"129 tokens in decoder_input_ids \(or labels\) is longer than max_position_embeddings"
    ):
        model(input_ids=torch.full((1, 2), 5), decoder_input_ids=torch.full((1, 129), 5))


def test_decoder_without_encoder_output_is_an_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        model.model.decoder(input_ids=torch.full((1, 2), 5))


def test_input_ids_and_inputs_embeds_together_is_an_error():
    model = tiny_model()
    ids = torch.full((1, 3), 5)
    with pytest.raises(ValueError, match="Got both input_ids and inputs_embeds: pass exactly one of them"):
        model.model.encoder(input_ids=ids, inputs_embeds=model.model.shared(ids))


@pytest.mark.parametrize("length", [{}, {"max_new_tokens": 20}], ids=["paper's limit", "max_new_tokens"])
def test_an_end_token_given_to_generate_ends_and_pads_as_the_models_own_would(length):
    """generate(eos_token_id=E) gives what a model whose own end token is E gives: the same
    hypotheses, each padded with <pad> after its first E, whichever way the length is limited."""
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, num_return_sequences=4, **length)
    written = model.generate(**settings | {"max_new_tokens": 10})[:, 1:].flatten()
    end = int(written[written > 3].mode().values)  # a word this model writes often, as the end token
    given = model.generate(**settings | {"eos_token_id": end})
    model.generation_config.eos_token_id = end
    own = model.generate(**settings)
    assert torch.equal(given, own)
    assert (given == end).any(dim=1).all() and (given[:, -1] == model.config.pad_token_id).any()
