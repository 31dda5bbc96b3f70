"""A saved folder is a Hub checkpoint: the Auto classes find the model, weights come back bit for bit
with their ties, the tied matrix is stored once, the paper's decoding settings travel in
`generation_config.json`, and the folder loads with ``trust_remote_code=True`` where this package is
not installed. References: the model before saving, the paper's formulas, the package's own source
files, and a second process without the package."""

import inspect
import json
import math
import textwrap

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import vanilla_transformer.configuration_vanilla_transformer as configuration_module
import vanilla_transformer.generation_vanilla_transformer as generation_module
import vanilla_transformer.modeling_vanilla_transformer as modeling_module
from helpers import run_without_package
from vanilla_transformer import (
    PRESETS,
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)

# A padded batch, so that masks take part in every comparison.
SOURCE = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
SOURCE_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
TARGET_PREFIX = torch.tensor([[2, 11, 12], [2, 13, 14]])

VARIANTS = {
    "paper": {},
    "separate-vocabularies": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=900),
    "untied-projection": dict(tie_word_embeddings=False),
}


def tiny_model(**overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", **overrides)).eval()


@torch.no_grad()
def logits_of(model) -> torch.Tensor:
    return model(input_ids=SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=TARGET_PREFIX).logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The paper's tiny model saved once; returns (model, folder)."""
    model = tiny_model()
    folder = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(folder)
    return model, folder


def stored_shapes(folder) -> dict[str, tuple[int, ...]]:
    with safe_open(folder / "model.safetensors", framework="pt") as weights:
        return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}


# ---------------------------------------------------------------------------------------------
# Auto classes
# ---------------------------------------------------------------------------------------------


@pytest.mark.floor
def test_import_registers_the_model_with_the_auto_classes():
    assert type(AutoConfig.for_model("vanilla_transformer")) is VanillaTransformerConfig
    config = AutoConfig.for_model("vanilla_transformer", **PRESETS["tiny"])
    assert type(config) is VanillaTransformerConfig and config.d_model == PRESETS["tiny"]["d_model"]
    assert type(AutoModel.from_config(config)) is VanillaTransformerModel
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is VanillaTransformerForConditionalGeneration


# ---------------------------------------------------------------------------------------------
# Weights: exact reload, ties, one stored copy of a tied matrix
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.floor
def test_reload_gives_identical_logits_and_no_missing_keys(tmp_path, variant):
    model = tiny_model(**VARIANTS[variant])
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(reloaded) is VanillaTransformerForConditionalGeneration
    assert not reloaded.training
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert torch.equal(logits_of(reloaded), logits_of(model))


def embedding_matrices(model) -> dict[str, torch.Tensor]:
    return {
        "lm_head": model.lm_head.weight,
        "shared": model.model.shared.weight,
        "encoder": model.model.encoder.embedding.token_embedding.weight,
        "decoder": model.model.decoder.embedding.token_embedding.weight,
    }


# Which of the four matrices are one tensor, per variant (§3.4 for the paper).
TIED_GROUPS = {
    "paper": [{"lm_head", "shared", "encoder", "decoder"}],
    "separate-vocabularies": [{"shared", "encoder"}, {"decoder", "lm_head"}],
    "untied-projection": [{"shared", "encoder", "decoder"}, {"lm_head"}],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_reloaded_embeddings_are_tied_exactly_as_configured(tmp_path, variant):
    tiny_model(**VARIANTS[variant]).save_pretrained(tmp_path)
    matrices = embedding_matrices(AutoModelForSeq2SeqLM.from_pretrained(tmp_path))
    for group in TIED_GROUPS[variant]:
        first = matrices[next(iter(group))]
        for name in group:
            assert matrices[name] is first, f"{name} should be tied to {group}"
            assert matrices[name].data_ptr() == first.data_ptr()
        for other in set(matrices) - group:
            assert matrices[other].data_ptr() != first.data_ptr(), f"{other} should not be tied to {group}"


# The embedding-shaped matrices stored in model.safetensors, per variant: each tied group once.
STORED_EMBEDDING_SHAPES = {
    "paper": [(1000, 64)],
    "separate-vocabularies": [(900, 64), (1000, 64)],
    "untied-projection": [(1000, 64), (1000, 64)],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_safetensors_stores_each_tied_matrix_once(tmp_path, variant):
    tiny_model(**VARIANTS[variant]).save_pretrained(tmp_path)
    shapes = stored_shapes(tmp_path)
    vocabulary_sized = sorted(shape for shape in shapes.values() if len(shape) == 2 and shape[0] >= 900)
    assert vocabulary_sized == STORED_EMBEDDING_SHAPES[variant]
    assert "model.shared.weight" in shapes  # the source of every tie


def test_resized_shared_vocabulary_survives_save_and_reload(tmp_path):
    # resize_token_embeddings is how users add tokens; the joint vocabulary must stay joint.
    model = tiny_model()
    model.resize_token_embeddings(1008)
    assert model.lm_head.weight.shape == (1008, 64)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight.shape == reloaded.model.decoder.embedding.token_embedding.weight.shape == (1008, 64)
    assert torch.equal(logits_of(reloaded), logits_of(model))


# ---------------------------------------------------------------------------------------------
# The folder: auto_map, source files, generation settings
# ---------------------------------------------------------------------------------------------


def test_config_json_maps_every_auto_class_to_the_copied_files(saved):
    _, folder = saved
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }


def test_source_files_are_copied_flat_and_unchanged(saved):
    _, folder = saved
    for module in (configuration_module, modeling_module, generation_module):
        copied = folder / f"{module.__name__.rsplit('.', 1)[1]}.py"
        assert copied.read_text() == inspect.getsource(module)
    assert not [path for path in folder.iterdir() if path.is_dir()]


def test_generation_config_carries_the_paper_decoding_and_the_special_ids(tmp_path):
    # Non-default ids, so that they can only have come from the model config.
    ids = dict(pad_token_id=1, bos_token_id=5, eos_token_id=4, decoder_start_token_id=6)
    tiny_model(**ids).save_pretrained(tmp_path)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    # §6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6".
    assert generation["num_beams"] == 4
    assert generation["length_penalty"] == 0.6
    assert generation["early_stopping"] is True
    assert {name: generation[name] for name in ids} == ids
    # §6.1's limit is relative to the input: readers that know only max_length get the longest it allows
    assert generation["max_new_tokens_beyond_input"] == 50
    assert generation["max_length"] == tiny_model(**ids).config.max_position_embeddings


# ---------------------------------------------------------------------------------------------
# Positions are recomputed, not stored
# ---------------------------------------------------------------------------------------------


def paper_positional_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5), element by element."""
    table = [[0.0] * d_model for _ in range(num_positions)]
    for pos in range(num_positions):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos][2 * i] = math.sin(angle)
            table[pos][2 * i + 1] = math.cos(angle)
    return torch.tensor(table, dtype=torch.float32)


def test_sinusoidal_table_is_not_stored_and_equals_the_formula_after_loading(saved):
    _, folder = saved
    assert not [key for key in stored_shapes(folder) if "positional" in key]
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(folder)
    config = reloaded.config
    expected = paper_positional_encoding(config.max_position_embeddings, config.d_model)
    for stack in (reloaded.model.encoder, reloaded.model.decoder):
        torch.testing.assert_close(stack.embedding.positional_encoding.table, expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# Attention implementations
# ---------------------------------------------------------------------------------------------


def test_eager_and_sdpa_loads_agree(saved):
    model, folder = saved
    eager = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager")
    sdpa = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager"
    assert sdpa.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits_of(eager), logits_of(sdpa), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_of(eager), logits_of(model), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# trust_remote_code in a process without the package
# ---------------------------------------------------------------------------------------------

REMOTE_LOAD = """
import os
os.environ["HF_MODULES_CACHE"] = {modules_cache!r}  # keep the copied modules inside the test folder
import torch
from transformers import AutoModel, AutoModelForSeq2SeqLM

inputs = torch.load({inputs!r})
seq2seq, info = AutoModelForSeq2SeqLM.from_pretrained({folder!r}, trust_remote_code=True, output_loading_info=True)
base = AutoModel.from_pretrained({folder!r}, trust_remote_code=True)
with torch.no_grad():
    logits = seq2seq(**inputs).logits
    hidden = base(**inputs).last_hidden_state
    generated = seq2seq.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
torch.save(
    dict(
        logits=logits, hidden=hidden, generated=generated,
        modules=[type(seq2seq).__module__, type(base).__module__, type(seq2seq.config).__module__,
                 *(kind.__module__ for kind in type(seq2seq).__mro__ if kind.__name__.startswith("VanillaTransformerGen"))],
        missing=sorted(info["missing_keys"]), unexpected=sorted(info["unexpected_keys"]),
    ),
    {results!r},
)
"""


@pytest.mark.floor
def test_remote_code_load_without_the_package_reproduces_logits_and_beam_search(saved, tmp_path):
    model, folder = saved
    inputs = dict(input_ids=SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=TARGET_PREFIX)
    torch.save(inputs, tmp_path / "inputs.pt")
    code = REMOTE_LOAD.format(
        modules_cache=str(tmp_path / "modules"),
        inputs=str(tmp_path / "inputs.pt"),
        folder=str(folder),
        results=str(tmp_path / "results.pt"),
    )
    run_without_package(textwrap.dedent(code), cwd=tmp_path)
    child = torch.load(tmp_path / "results.pt")

    assert all(module.startswith("transformers_modules.") for module in child["modules"]), child["modules"]
    assert child["modules"][-1].endswith("generation_vanilla_transformer")  # decoding came with the folder too
    assert child["missing"] == [] and child["unexpected"] == []
    with torch.no_grad():
        assert torch.allclose(child["logits"], model(**inputs).logits, atol=0, rtol=0)
        assert torch.allclose(child["hidden"], model.model(**inputs).last_hidden_state, atol=0, rtol=0)
        expected_ids = model.generate(input_ids=SOURCE, attention_mask=SOURCE_MASK)  # beam search, §6.1
    assert model.generation_config.num_beams == 4
    assert torch.equal(child["generated"], expected_ids)
