"""Specification of the model card: Hub metadata that huggingface_hub parses back into what was given,
and a body that states results, architecture, recipe, usage and limitations.

References: the arguments written out below, the model's config and parameter count, huggingface_hub's
own card parsers (`metadata_load`, `ModelCard`, `model_index_to_eval_results`), and the pipeline run
directly for the usage example the card shows.
"""

import json
import re

import pytest
import torch
from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results
from transformers import GenerationConfig

from test_pipeline import one_torch_thread, paper_beam_search, train_copying_translator  # noqa: F401 (fixture)
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, write_model_card

REPO_ID = "someone/vanilla-transformer-en-de"
METRICS = [
    {
        "name": "BLEU",
        "type": "bleu",
        "value": 27.31,
        "dataset": "wmt14",
        "dataset_name": "WMT14",
        "dataset_config": "de-en",
        "split": "test",
        "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    },
    {
        "name": "chrF",
        "type": "chrf",
        "value": 56.8,
        "dataset": "wmt14",
        "dataset_name": "WMT14",
        "dataset_config": "de-en",
        "split": "test",
        "signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    },
]
HYPERPARAMETERS = {"learning_rate": 0.0007, "warmup_steps": 4000, "label_smoothing_factor": 0.1, "max_tokens": 25000}
CARD_ARGUMENTS = dict(
    languages=("en", "de"),
    repo_id=REPO_ID,
    model_name="vanilla-transformer-en-de",
    datasets=["wmt14"],
    metrics=METRICS,
    training_hyperparameters=HYPERPARAMETERS,
    base_model="someone/vanilla-transformer-base",
    extra_notes="Trained for 100k steps on one GPU instead of 8.",
)


@pytest.fixture(scope="module")
def model():
    return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny"))


@pytest.fixture(scope="module")
def card_path(model, tmp_path_factory):
    return write_model_card(tmp_path_factory.mktemp("card"), model=model, **CARD_ARGUMENTS)


def test_the_card_is_the_folders_readme(card_path):
    assert card_path.name == "README.md" and card_path.read_text().startswith("---\n")


def test_metadata_has_the_hub_fields_given(card_path):
    metadata = metadata_load(card_path)
    assert metadata["language"] == ["en", "de"]
    assert metadata["license"] == "apache-2.0"
    assert metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == "translation"
    assert metadata["datasets"] == ["wmt14"]
    assert metadata["base_model"] == "someone/vanilla-transformer-base"
    assert metadata["metrics"] == ["bleu", "chrf"]
    assert {"translation", "vanilla-transformer"} <= set(metadata["tags"])


def test_model_index_parses_back_into_the_scores_given(card_path):
    name, results = model_index_to_eval_results(metadata_load(card_path)["model-index"])
    assert name == "vanilla-transformer-en-de"
    assert [
        dict(
            name=r.metric_name,
            type=r.metric_type,
            value=r.metric_value,
            dataset=r.dataset_type,
            dataset_name=r.dataset_name,
            dataset_config=r.dataset_config,
            split=r.dataset_split,
            signature=r.metric_args["signature"],
        )
        for r in results
    ] == METRICS
    assert {r.task_type for r in results} == {"translation"}


def test_metadata_round_trips_through_model_card_data(card_path):
    card = ModelCard.load(card_path)
    assert card.data.to_dict() == metadata_load(card_path)
    assert [r.metric_value for r in card.data.eval_results] == [m["value"] for m in METRICS]


def test_body_states_results_architecture_recipe_and_limitations(card_path, model):
    text = card_path.read_text()
    for metric in METRICS:  # a | inside a table cell is escaped (GitHub Markdown)
        signature = metric["signature"].replace("|", "\\|")
        assert f"| WMT14 (de-en) | test | {metric['name']} | {metric['value']:.2f} | `{signature}` |" in text
    for name, value in HYPERPARAMETERS.items():
        assert f"| {name} | {value} |" in text
    assert "| layers (encoder + decoder) | 2 + 2 |" in text and "| d_model / d_ff | 64 / 128 |" in text
    assert f"| parameters | {model.num_parameters() / 1e6:.1f}M |" in text
    assert (
        "Decoding (`generation_config.json`): beam size 4, length penalty alpha 0.6 (GNMT's ((5 + |Y|) / 6)^alpha, "
        "as the paper), at most input length + 50"
    ) in text
    base = "someone/vanilla-transformer-base"
    assert f"Fine-tuned from [{base}](https://huggingface.co/{base})" in text
    assert "Training data: wmt14." in text
    assert "## Limitations" in text and "Trained for 100k steps on one GPU instead of 8." in text


def test_a_card_written_from_a_saved_folder_states_the_length_rule_it_decodes_with(model, tmp_path):
    """save_pretrained writes max_length = max_position_embeddings for other readers; generate() still decodes
    to the source's length + 50 (tests/test_length_penalty.py), so the card must say so, as it does from the
    model in memory; a generation config that turns the rule off gets its max_length."""
    model.save_pretrained(tmp_path / "saved")
    text = write_model_card(tmp_path / "saved", languages=("en", "de")).read_text()
    positions = model.config.max_position_embeddings
    assert f"at most input length + 50 tokens (§6.1, {positions - 1} at most)." in text  # the start token takes one
    config = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    off = {**config, "max_new_tokens_beyond_input": None, "max_length": 40}
    (tmp_path / "saved" / "generation_config.json").write_text(json.dumps(off))
    assert "at most 40 tokens." in write_model_card(tmp_path / "saved", languages=("en", "de")).read_text()


def test_the_cards_length_limit_is_the_one_generate_applies_not_a_trainers_max_length(tmp_path):
    """A stock Seq2SeqTrainer leaves max_length 20 on the model's generation config; §6.1's rule ignores it, and
    the card once said "20 at most" of a model that then generated more. The reference is generate() itself."""
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny"))
    model.generation_config.max_length = 20
    text = write_model_card(tmp_path, model=model, languages=("en", "de")).read_text()
    positions = model.config.max_position_embeddings
    assert f"at most input length + 50 tokens (§6.1, {positions - 1} at most)." in text and "20 at most" not in text
    source = torch.full((1, 40), 5)
    model.generation_config.eos_token_id = None  # nothing ends a hypothesis early: the limit alone stops it
    new_tokens = model.generate(input_ids=source, num_beams=1).shape[1] - 1
    assert new_tokens == min(40 + 50, positions - 1) > 20


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_usage_example_with_the_package_prints_the_pipelines_translation(one_torch_thread, tmp_path, capsys):
    # The example without the package runs in test_hub.py, in a process without it.
    model, tokenizer = train_copying_translator()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with_package, without_package = python_blocks(write_model_card(tmp_path, model=model, **CARD_ARGUMENTS).read_text())
    assert f'pipeline("translation", model="{REPO_ID}", trust_remote_code=True)' in without_package
    example = re.search(r'translate\("(.*)"\)', with_package).group(1)
    expected = tokenizer.decode(paper_beam_search(model, tokenizer, [example])[0], skip_special_tokens=True)
    exec(with_package.replace(REPO_ID, str(tmp_path)), {})  # the folder stands in for the repo id
    assert capsys.readouterr().out.splitlines() == [str([{"translation_text": expected}])]


def test_without_scores_or_base_model_those_keys_are_absent(model, tmp_path):
    metadata = metadata_load(write_model_card(tmp_path, model=model, languages=("en", "fr")))
    assert "model-index" not in metadata and "base_model" not in metadata and "metrics" not in metadata
    assert "No evaluation results were recorded" in (tmp_path / "README.md").read_text()


def test_without_a_model_the_card_describes_the_saved_folder(model, tmp_path):
    model.save_pretrained(tmp_path)
    saved = GenerationConfig.from_pretrained(tmp_path)
    saved.length_penalty, saved.length_penalty_formula = 1.2, "length"  # as train.py --length_penalty 1.2 ... saves it
    saved.save_pretrained(tmp_path)
    text = write_model_card(tmp_path, languages=("en", "de")).read_text()
    assert "| layers (encoder + decoder) | 2 + 2 |" in text and "| parameters |" not in text
    assert "beam size 4, length penalty alpha 1.2 (|Y|^alpha)" in text  # read from generation_config.json


def test_an_encoder_and_decoder_of_other_sizes_and_unset_decoding_settings_are_described_as_they_run(tmp_path):
    """A converted MarianMT may differ by side: the card showed the encoder's d_ff and heads only; and a generation
    config without a beam size or length penalty (None in transformers 5) read "beam size None, alpha None",
    where generate() decodes greedily with alpha 1.0."""
    config = VanillaTransformerConfig.from_preset(
        "tiny", d_model=16, encoder_ffn_dim=24, decoder_ffn_dim=20, encoder_attention_heads=2, decoder_attention_heads=4
    )
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = GenerationConfig(decoder_start_token_id=config.decoder_start_token_id)
    text = write_model_card(tmp_path, model=model, languages=("en", "de")).read_text()
    assert "| d_model / d_ff | 16 / 24 (encoder) / 20 (decoder) |" in text
    assert "| attention heads (d_k) | 2 (8) (encoder) / 4 (4) (decoder) |" in text
    decoding = text.split("Decoding")[1].split("\n")[0]
    assert "greedy (beam size 1)" in decoding and "None" not in decoding and "penalty" not in decoding  # none applies


def test_a_generation_config_without_any_length_states_the_one_generate_applies(tmp_path):
    """§6.1's rule turned off and no max_length (None in transformers 5): the card said "at most None tokens".
    The reference is generate() itself, which then decodes transformers' default of 20 new tokens."""
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny"))
    model.generation_config.max_new_tokens_beyond_input = None
    model.generation_config.max_length = None
    text = write_model_card(tmp_path, model=model, languages=("en", "de")).read_text()
    model.generation_config.eos_token_id = None  # nothing ends a hypothesis early: the limit alone stops it
    with pytest.warns(UserWarning, match="default"):
        new_tokens = model.generate(input_ids=torch.full((1, 5), 5), num_beams=1).shape[1] - 1
    assert f"at most {new_tokens} new tokens (transformers' default)." in text and "None" not in text


@pytest.mark.parametrize(
    "shared, tied, row",
    [
        (True, True, "| vocabulary | 96, one matrix for both embeddings and the output projection |"),
        (True, False, "| vocabulary | 96, one matrix for both embeddings |"),
        (False, True, "| vocabulary | 96 (source) / 120 (target), the output projection is the target embedding |"),
        (False, False, "| vocabulary | 96 (source) / 120 (target) |"),
    ],
)
def test_the_vocabulary_row_names_each_sides_size_and_the_matrices_that_are_one(tmp_path, shared, tied, row):
    """A converted MarianMT may have two vocabularies: the row gave the source's size alone. The reference: the
    model's own matrices, compared by identity."""
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=96,
        decoder_vocab_size=96 if shared else 120,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    embeddings = model.get_encoder().get_input_embeddings().weight, model.get_decoder().get_input_embeddings().weight
    assert (embeddings[0] is embeddings[1]) == shared and (model.lm_head.weight is embeddings[1]) == tied
    assert (embeddings[0].shape[0], model.lm_head.weight.shape[0]) == (96, 96 if shared else 120)
    assert row in write_model_card(tmp_path, model=model, languages=("en", "de")).read_text()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(metrics=[{"name": "BLEU", "type": "bleu", "dataset": "wmt14"}]), r"metrics\[0\] lacks \['value'\]"),
        (dict(metrics=[{**METRICS[0], "bleu_score": 1}]), r"unknown keys \['bleu_score'\]"),
        (dict(metrics=[{**METRICS[0], "value": "27.3"}]), "must be a finite number"),
        (dict(languages="en-de"), r"\(source, target\) language codes"),
        (dict(config=VanillaTransformerConfig.from_preset("tiny")), "Pass model or config, not both"),
    ],
    ids=["missing-value", "unknown-key", "text-value", "one-language-string", "model-and-config"],
)
def test_bad_arguments_are_refused_with_the_fix(model, tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        write_model_card(tmp_path, **{"model": model, "languages": ("en", "de"), **arguments})
    assert not (tmp_path / "README.md").exists()


def test_a_folder_without_model_or_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        write_model_card(tmp_path, languages=("en", "de"))
