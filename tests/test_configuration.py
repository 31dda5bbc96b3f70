"""The configuration as a specification: the paper's sizes (Table 3), its defaults, and every rule the
config enforces, each checked against an independent reference (the paper, a formula written out
here, or a second code path of the library)."""

import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import AutoConfig
from transformers.cache_utils import DynamicCache

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
)

# Table 3 of the paper ("Attention Is All You Need"), with the vocabulary of §5.1 (a shared
# source-target BPE vocabulary of about 37000 tokens for WMT 2014 English-German).
PAPER_TABLE_3 = {
    "base": dict(N=6, d_model=512, d_ff=2048, h=8, d_k=64, d_v=64, P_drop=0.1),
    "big": dict(N=6, d_model=1024, d_ff=4096, h=16, d_k=64, d_v=64, P_drop=0.3),
}
PAPER_VOCABULARY = 37000


# ---------------------------------------------------------------------------------------------
# Parameter counts, derived by hand from the paper's shapes
# ---------------------------------------------------------------------------------------------


def attention_parameters(d_model: int) -> int:
    """Q, K, V and output projections (§3.2.2), each d_model x d_model with a bias."""
    return 4 * (d_model * d_model + d_model)


def feed_forward_parameters(d_model: int, d_ff: int) -> int:
    """W1 (d_model x d_ff) + b1 + W2 (d_ff x d_model) + b2 (§3.3, Eq. 2)."""
    return d_model * d_ff + d_ff + d_ff * d_model + d_model


def layer_norm_parameters(d_model: int) -> int:
    return 2 * d_model  # gain and bias


def paper_parameter_count(vocab: int, d_model: int, d_ff: int, encoder_layers: int, decoder_layers: int) -> int:
    """The post-LN Transformer with one embedding matrix shared by source, target and pre-softmax
    projection (§3.4) and parameter-free sinusoidal positions (§3.5); no final LayerNorm."""
    encoder_layer = (
        attention_parameters(d_model) + feed_forward_parameters(d_model, d_ff) + 2 * layer_norm_parameters(d_model)
    )
    decoder_layer = (
        2 * attention_parameters(d_model) + feed_forward_parameters(d_model, d_ff) + 3 * layer_norm_parameters(d_model)
    )
    return vocab * d_model + encoder_layers * encoder_layer + decoder_layers * decoder_layer


def count_parameters(config: VanillaTransformerConfig) -> int:
    """Unique parameters of the full model: `parameters()` yields a tied tensor once."""
    with torch.device("meta"):  # shapes only, no memory, no initialisation cost
        model = VanillaTransformerForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())


TINY = dict(vocab=1000, d_model=64, d_ff=128, encoder_layers=2, decoder_layers=2)


def tiny_paper_count() -> int:
    return paper_parameter_count(**TINY)


def test_base_model_parameter_count_matches_the_paper_shapes():
    paper = PAPER_TABLE_3["base"]
    expected = paper_parameter_count(PAPER_VOCABULARY, paper["d_model"], paper["d_ff"], paper["N"], paper["N"])
    count = count_parameters(VanillaTransformerConfig.from_preset("base", vocab_size=PAPER_VOCABULARY))
    assert count == expected
    assert round(count / 1e6, 1) == 63.1


def test_big_model_parameter_count_matches_the_paper_shapes():
    paper = PAPER_TABLE_3["big"]
    expected = paper_parameter_count(PAPER_VOCABULARY, paper["d_model"], paper["d_ff"], paper["N"], paper["N"])
    count = count_parameters(VanillaTransformerConfig.from_preset("big", vocab_size=PAPER_VOCABULARY))
    assert count == expected
    assert abs(count - 213e6) / 213e6 < 0.01  # Table 3 reports 213 x 10^6 for the big model


def test_pre_norm_adds_exactly_one_final_layer_norm_per_stack():
    count = count_parameters(VanillaTransformerConfig.from_preset("tiny", normalize_before=True))
    assert count == tiny_paper_count() + 2 * layer_norm_parameters(TINY["d_model"])


def test_learned_positions_add_one_table_per_stack():
    config = VanillaTransformerConfig.from_preset("tiny", position_embedding_type="learned")
    count = count_parameters(config)
    assert count == tiny_paper_count() + 2 * config.max_position_embeddings * TINY["d_model"]


def test_separate_vocabularies_add_a_decoder_embedding():
    target_vocab = 700
    config = VanillaTransformerConfig.from_preset(
        "tiny", share_encoder_decoder_embeddings=False, decoder_vocab_size=target_vocab
    )
    # The pre-softmax projection stays tied, now to the target embedding.
    assert count_parameters(config) == tiny_paper_count() + target_vocab * TINY["d_model"]


def test_untied_pre_softmax_projection_adds_its_matrix():
    config = VanillaTransformerConfig.from_preset("tiny", tie_word_embeddings=False)
    assert count_parameters(config) == tiny_paper_count() + TINY["vocab"] * TINY["d_model"]  # no bias


def test_separate_vocabularies_and_untied_projection_add_two_target_sized_matrices():
    target_vocab = 700
    config = VanillaTransformerConfig.from_preset(
        "tiny", share_encoder_decoder_embeddings=False, decoder_vocab_size=target_vocab, tie_word_embeddings=False
    )
    assert count_parameters(config) == tiny_paper_count() + 2 * target_vocab * TINY["d_model"]


# ---------------------------------------------------------------------------------------------
# Presets and defaults
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["base", "big"])
def test_presets_equal_table_3(name):
    paper = PAPER_TABLE_3[name]
    config = VanillaTransformerConfig.from_preset(name)
    assert config.encoder_layers == config.decoder_layers == paper["N"]
    assert config.d_model == paper["d_model"]
    assert config.encoder_ffn_dim == config.decoder_ffn_dim == paper["d_ff"]
    assert config.encoder_attention_heads == config.decoder_attention_heads == paper["h"]
    assert config.dropout == paper["P_drop"]
    assert config.head_dim is None  # d_k = d_v = d_model / h
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    for attention in (model.model.encoder.layers[0].self_attention, model.model.decoder.layers[0].cross_attention):
        assert attention.head_dim == paper["d_k"] == paper["d_v"]
        assert attention.scaling == pytest.approx(paper["d_k"] ** -0.5)  # 1/sqrt(d_k) of Eq. 1


@pytest.mark.parametrize("name", ["base", "big", "tiny"])
def test_presets_use_the_paper_architecture_choices(name):
    config = VanillaTransformerConfig.from_preset(name)
    assert config.activation_function == "relu"  # Eq. 2
    assert config.scale_embedding is True  # §3.4: embeddings times sqrt(d_model)
    assert config.position_embedding_type == "sinusoidal"  # §3.5
    assert config.normalize_before is False  # §3.1: LayerNorm(x + Sublayer(x))
    assert config.share_encoder_decoder_embeddings is True  # §3.4
    assert config.tie_word_embeddings is True  # §3.4
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0  # not in the paper


def test_default_config_is_the_base_preset():
    assert VanillaTransformerConfig().to_dict() == VanillaTransformerConfig.from_preset("base").to_dict()


def test_from_preset_applies_overrides_and_keeps_the_rest():
    config = VanillaTransformerConfig.from_preset("base", dropout=0.2, decoder_layers=3, vocab_size=8000)
    assert (config.dropout, config.decoder_layers, config.vocab_size) == (0.2, 3, 8000)
    assert config.decoder_vocab_size == 8000  # follows vocab_size when not given
    assert (config.encoder_layers, config.d_model, config.encoder_ffn_dim) == (6, 512, 2048)


def test_unknown_preset_is_rejected_with_the_available_names():
    with pytest.raises(ValueError, match=r"Unknown preset 'huge'.*'base'.*'big'"):
        VanillaTransformerConfig.from_preset("huge")


# ---------------------------------------------------------------------------------------------
# Validation: every rejected configuration, with its message
# ---------------------------------------------------------------------------------------------


def build_tiny(**overrides) -> VanillaTransformerConfig:
    return VanillaTransformerConfig.from_preset("tiny", **overrides)


def assert_rejected(overrides: dict, message: str):
    with pytest.raises(StrictDataclassClassValidationError, match=message) as error:
        build_tiny(**overrides)
    assert isinstance(error.value.__cause__, ValueError)


@pytest.mark.parametrize("field", ["encoder_attention_heads", "decoder_attention_heads"])
def test_heads_must_divide_d_model_when_head_dim_is_not_given(field):
    assert_rejected({"d_model": 64, field: 3}, rf"d_model=64 is not divisible by {field}=3")


@pytest.mark.parametrize("value", [0.0, -1e-6, float("nan"), float("inf")])
@pytest.mark.parametrize("field", ["layer_norm_eps", "init_std", "linear_init_std"])
def test_a_scale_must_be_positive_and_finite(field, value):
    """The reference: LayerNorm(eps=inf) maps every input to its bias, and a normal of infinite std gives inf
    and nan weights; zero, negative and nan scales are meaningless."""
    overrides = {field: value, **({"linear_init": "normal"} if field == "linear_init_std" else {})}
    assert_rejected(overrides, rf"{field} must be positive and finite")


def test_head_dim_decouples_heads_from_d_model():
    # Table 3, rows B vary d_k independently of d_model: the inner width becomes h * d_k.
    config = VanillaTransformerConfig(d_model=512, encoder_attention_heads=16, decoder_attention_heads=16, head_dim=32)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    attention = model.model.encoder.layers[0].self_attention
    assert attention.q_proj.weight.shape == (16 * 32, 512)
    assert attention.out_proj.weight.shape == (512, 16 * 32)


def test_head_dim_allows_a_head_count_that_does_not_divide_d_model():
    config = build_tiny(encoder_attention_heads=3, decoder_attention_heads=5, head_dim=8)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    encoder_attention = model.model.encoder.layers[0].self_attention
    decoder_attention = model.model.decoder.layers[0].cross_attention
    assert encoder_attention.q_proj.weight.shape == (3 * 8, 64)
    assert decoder_attention.k_proj.weight.shape == (5 * 8, 64)
    assert decoder_attention.out_proj.weight.shape == (64, 5 * 8)
    logits = model(input_ids=torch.tensor([[5, 6, 7, 3]]), decoder_input_ids=torch.tensor([[2, 8]])).logits
    assert logits.shape == (1, 2, 1000)


SIZE_FIELDS = [
    "vocab_size",
    "decoder_vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "head_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
]


@pytest.mark.parametrize("value", [0, -2])
@pytest.mark.parametrize("field", SIZE_FIELDS)
def test_sizes_must_be_positive(field, value):
    overrides = {field: value}
    if field == "decoder_vocab_size":
        overrides["share_encoder_decoder_embeddings"] = False
    assert_rejected(overrides, rf"{field} must be a positive integer, got {value}\.")


@pytest.mark.parametrize("value", [1.0, -0.1])
@pytest.mark.parametrize("field", ["dropout", "attention_dropout", "activation_dropout"])
def test_dropout_probabilities_must_lie_in_zero_one(field, value):
    assert_rejected({field: value}, rf"{field} must be in \[0, 1\), got {value}\.")


def test_unknown_activation_is_rejected():
    assert_rejected({"activation_function": "swishy"}, r"Unknown activation_function 'swishy'; the paper uses 'relu'")


def test_unknown_position_type_is_rejected():
    assert_rejected({"position_embedding_type": "rotary"}, r"Unknown position_embedding_type 'rotary'")


def test_sinusoidal_positions_need_an_even_d_model():
    assert_rejected(
        {"d_model": 63, "encoder_attention_heads": 1, "decoder_attention_heads": 1},
        r"d_model must be even, got 63",
    )


def test_odd_d_model_is_fine_with_learned_positions():
    config = build_tiny(
        d_model=63, encoder_attention_heads=1, decoder_attention_heads=1, position_embedding_type="learned"
    )
    assert config.d_model == 63


def test_shared_embeddings_need_one_joint_vocabulary():
    assert_rejected({"decoder_vocab_size": 900}, r"share_encoder_decoder_embeddings=True needs one joint vocabulary")


def test_a_joint_vocabulary_given_a_new_size_after_construction_is_the_targets_too(tmp_path):
    """transformers sets from_pretrained's overrides after construction: vocab_size=N left the target side's
    size behind, and the model built from it failed at its first save (its joint-vocabulary check). The
    reference: the config built with that size."""
    VanillaTransformerConfig.from_preset("tiny", vocab_size=60).save_pretrained(tmp_path)
    reference = VanillaTransformerConfig.from_preset("tiny", vocab_size=100)
    overridden = AutoConfig.from_pretrained(tmp_path, vocab_size=100)
    assert (
        (overridden.vocab_size, overridden.decoder_vocab_size)
        == (100, 100)
        == (
            reference.vocab_size,
            reference.decoder_vocab_size,
        )
    )
    model = VanillaTransformerForConditionalGeneration(overridden)
    assert model.lm_head.out_features == 100
    model.save_pretrained(tmp_path / "model")  # the check before saving passes
    overridden.vocab_size = 500
    assert overridden.decoder_vocab_size == 500
    separate = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=60, decoder_vocab_size=70, share_encoder_decoder_embeddings=False
    )
    separate.vocab_size = 80  # two vocabularies: the target's stays its own
    assert separate.decoder_vocab_size == 70


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pad_token_id": 1000}, r"pad_token_id=1000 is outside the source vocabulary of size 1000"),
        ({"eos_token_id": -1}, r"eos_token_id=-1 is outside the source vocabulary of size 1000"),
        ({"bos_token_id": 1000}, r"bos_token_id=1000 is outside the target vocabulary of size 1000"),
        # Separate vocabularies: pad and eos are checked on both sides, bos and decoder start on the target side.
        (
            {
                "share_encoder_decoder_embeddings": False,
                "vocab_size": 10,
                "decoder_vocab_size": 100,
                "pad_token_id": 50,
            },
            r"pad_token_id=50 is outside the source vocabulary of size 10",
        ),
        (
            {
                "share_encoder_decoder_embeddings": False,
                "vocab_size": 100,
                "decoder_vocab_size": 10,
                "eos_token_id": 50,
            },
            r"eos_token_id=50 is outside the target vocabulary of size 10",
        ),
        (
            {
                "share_encoder_decoder_embeddings": False,
                "vocab_size": 100,
                "decoder_vocab_size": 10,
                "bos_token_id": 50,
            },
            r"bos_token_id=50 is outside the target vocabulary of size 10",
        ),
        (
            {
                "share_encoder_decoder_embeddings": False,
                "vocab_size": 100,
                "decoder_vocab_size": 10,
                "decoder_start_token_id": 50,
            },
            r"decoder_start_token_id=50 is outside the target vocabulary of size 10",
        ),
    ],
)
def test_special_token_ids_must_lie_in_their_vocabulary(overrides, message):
    assert_rejected(overrides, message)


def test_target_only_ids_may_exceed_the_source_vocabulary():
    config = build_tiny(
        share_encoder_decoder_embeddings=False,
        vocab_size=10,
        decoder_vocab_size=100,
        bos_token_id=50,
        decoder_start_token_id=60,
    )
    assert (config.bos_token_id, config.decoder_start_token_id) == (50, 60)


def test_decoder_start_token_is_required():
    assert_rejected({"decoder_start_token_id": None}, r"decoder_start_token_id must be set")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("normalize_before", "False"),  # a non-empty string is true: it would build the pre-norm model
        ("scale_embedding", "False"),
        ("tie_word_embeddings", "no"),
        ("share_encoder_decoder_embeddings", "False"),
        ("dropout", "0.1"),
        ("eos_token_id", [3, 4]),
        ("pad_token_id", 0.0),
        ("d_model", 64.0),
        ("position_embedding_type", 1),
    ],
)
def test_a_value_of_another_type_than_the_fields_is_refused_naming_the_field(field, value):
    """The reference: each field's annotation on the class (a bool is a bool, an id an int)."""
    with pytest.raises(StrictDataclassFieldValidationError, match=f"'{field}'"):
        VanillaTransformerConfig.from_preset("tiny", **{field: value})


@pytest.mark.parametrize("field", ["layer_norm_eps", "init_std", "linear_init_std", "dropout"])
def test_a_whole_number_is_taken_where_the_field_is_a_float(field):
    assert getattr(VanillaTransformerConfig.from_preset("tiny", **{field: 1 if field != "dropout" else 0}), field) in (
        0,
        1,
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
        ("decoder_vocab_size", 900, r"needs one joint vocabulary"),
        ("encoder_attention_heads", 3, r"not divisible by encoder_attention_heads=3"),
    ],
)
def test_save_pretrained_rejects_a_config_mutated_into_an_invalid_one(tmp_path, field, value, message):
    config = build_tiny()
    setattr(config, field, value)
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dropout", 1.5, r"dropout must be in \[0, 1\)"),
        ("d_model", 63, r"not divisible by encoder_attention_heads"),
        ("vocab_size", 2, r"eos_token_id"),
        ("position_embedding_type", "rope", r"Unknown position_embedding_type 'rope'"),
        ("linear_init", "xavier", r"Unknown linear_init 'xavier'"),
    ],
)
def test_values_given_to_from_pretrained_and_a_config_edited_before_the_model_are_checked(
    tmp_path, field, value, message
):
    """transformers sets from_pretrained's keyword values on the loaded config after construction, unchecked:
    each crashed deep inside (an IndexError at the forward, a KeyError), or trained on as if valid. The
    reference: the constructor's own refusal of the same value."""
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        VanillaTransformerConfig.from_preset("tiny", **{field: value})
    build_tiny().save_pretrained(tmp_path)
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        VanillaTransformerConfig.from_pretrained(tmp_path, **{field: value})
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, **{field: value})
    edited = build_tiny()
    setattr(edited, field, value)
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        VanillaTransformerForConditionalGeneration(edited)


# ---------------------------------------------------------------------------------------------
# JSON round trip and the library's view of the decoder
# ---------------------------------------------------------------------------------------------


def comparable(config) -> dict:
    # `from_pretrained` records where the config came from in `_name_or_path`: not a setting.
    return {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(
            share_encoder_decoder_embeddings=False,
            decoder_vocab_size=900,
            tie_word_embeddings=False,
            position_embedding_type="learned",
            normalize_before=True,
            head_dim=8,
            decoder_layers=3,
            decoder_attention_heads=2,
            activation_function="gelu",
            scale_embedding=False,
            init_std=0.02,
            attention_dropout=0.1,
            activation_dropout=0.2,
            layer_norm_eps=1e-6,
            linear_init="xavier_uniform",
        ),
    ],
    ids=["paper", "every-variant"],
)
def test_config_survives_a_json_round_trip_through_auto_config(tmp_path, overrides):
    config = build_tiny(**overrides)
    config.save_pretrained(tmp_path)
    on_disk = json.loads((tmp_path / "config.json").read_text())
    assert on_disk["model_type"] == "vanilla_transformer"
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is VanillaTransformerConfig
    assert comparable(loaded) == comparable(config)


def test_decoder_text_config_reports_the_decoder_depth_and_heads():
    config = build_tiny(encoder_layers=2, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=2)
    decoder = config.get_text_config(decoder=True)
    assert (decoder.num_hidden_layers, decoder.num_attention_heads, decoder.hidden_size) == (3, 2, 64)
    encoder = config.get_text_config(encoder=True)
    assert (encoder.num_hidden_layers, encoder.num_attention_heads) == (2, 4)
    assert (config.num_hidden_layers, config.encoder_layers, config.decoder_layers) == (2, 2, 3)  # not mutated
    # Second code path: the library sizes a decoder's cache from the config.
    assert len(DynamicCache(config=config).layers) == 3


def test_decoder_text_config_reports_the_target_vocabulary():
    config = build_tiny(share_encoder_decoder_embeddings=False, decoder_vocab_size=900)
    assert config.get_text_config(decoder=True).vocab_size == 900
    assert config.get_text_config(encoder=True).vocab_size == 1000


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"pad_token_id": None}, "pad_token_id must be set: batches are padded with it"),
        (
            {"is_encoder_decoder": False},
            r"is_encoder_decoder=False, is_decoder=False: this model is an encoder-decoder",
        ),
        ({"is_decoder": True}, r"is_encoder_decoder=True, is_decoder=True"),
        ({"max_position_embeddings": 1}, "max_position_embeddings must be at least 2"),
    ],
)
def test_settings_the_model_cannot_run_with_are_rejected(overrides, message):
    assert_rejected(overrides, message)


def test_generation_settings_given_to_the_config_are_named_as_left_out(caplog):
    """transformers drops them from a model config in silence; they belong in the generation config."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            config = build_tiny(num_beams=5, length_penalty=2.0)
    finally:
        transformers_logging.disable_propagation()
    assert not hasattr(config, "num_beams")
    assert any(
        "length_penalty=2.0, num_beams=5: generation settings belong in model.generation_config" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
