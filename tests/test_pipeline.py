"""Specification of the translation pipeline: the old ``translation`` pipeline's call and output on
transformers 5, the paper's decoding, batching, language codes, and how checkpoints carry it.

The reference is ``model.generate`` called directly with §6.1's settings written out (beam size 4,
length penalty 0.6, input length + 50), on the same padded batches. The model is trained here for a
few steps to copy its input, so that translations are short, varied and end with ``</s>``. Loading
the pipeline as remote code where the package is not installed is tested here from a folder, and in
test_hub.py from a (loopback) Hub repository.
"""

import copy
import inspect
import json
import textwrap

import pytest
import torch
from transformers import pipeline
from transformers.pipelines import get_supported_tasks

import vanilla_transformer.pipeline_vanilla_transformer as pipeline_module
from helpers import run_without_package
from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTranslationPipeline,
    check_tokenizer_matches_model,
    train_tokenizer,
)

TASK = "vanilla-translation"
SENTENCES = [
    f"{subject} {verb} {place}"
    for subject in ("A man", "Two dogs", "The child", "A woman")
    for verb in ("walks", "runs", "sits")
    for place in ("in the park.", "on the street.", "near the water.")
]
TEXTS = [
    "Two dogs sit near the water.",
    "A man runs.",
    "The child walks on the street.",
    "A woman",
    "A dog runs in the park.",
]
# config.json's `custom_pipelines`, written out: the task a checkpoint declares for trust_remote_code=True.
DECLARED_PIPELINES = {
    "translation": {"impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"]}
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # The machine's two cores are shared with other test runs: with one thread per process a tiny
    # model trains and decodes ten times faster than with oversubscribed threads.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def train_copying_translator(steps: int = 30):
    """A 1+1-layer model trained for `steps` steps to copy its input, and its tokenizer."""
    tokenizer = train_tokenizer(iter(SENTENCES), vocab_size=300)
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=0.0,
        max_position_embeddings=128,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    batch = tokenizer(SENTENCES, text_target=SENTENCES, padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer


@torch.no_grad()
def paper_beam_search(model, tokenizer, texts, **overrides) -> torch.Tensor:
    """§6.1 written out: beam size 4, length penalty 0.6, at most input length + 50 new tokens."""
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    settings = dict(
        num_beams=4, length_penalty=0.6, early_stopping=True, max_new_tokens=batch["input_ids"].shape[1] + 50
    )
    return model.generate(**batch, **{**settings, **overrides})


@pytest.fixture(scope="module")
def translator():
    return train_copying_translator()


@pytest.fixture(scope="module")
def translate(translator):
    model, tokenizer = translator
    return pipeline(TASK, model=model, tokenizer=tokenizer)


@pytest.mark.floor
def test_import_registers_the_task_while_the_removed_translation_task_still_raises(translator):
    model, tokenizer = translator
    assert TASK in get_supported_tasks()
    with pytest.raises(KeyError, match="translation"):  # the wording changed in transformers 5.20
        pipeline("translation", model=model, tokenizer=tokenizer)


@pytest.mark.floor
def test_a_sentence_gives_one_translation_from_the_papers_beam_search(translator, translate):
    model, tokenizer = translator
    expected_ids = paper_beam_search(model, tokenizer, [TEXTS[0]])[0]
    expected_text = tokenizer.decode(expected_ids, skip_special_tokens=True)
    assert expected_text.startswith("Two dogs")  # the model copies, more or less
    assert translate(TEXTS[0]) == [{"translation_text": expected_text}]
    [record] = translate(TEXTS[0], return_tensors=True)
    assert torch.equal(record["translation_token_ids"], expected_ids)


def test_a_list_is_translated_in_padded_batches_as_generate_does(translator, translate):
    model, tokenizer = translator
    # batch_size=3 over five texts: batches [0:3] and [3:5], each padded to its longest text
    expected = [row for start in (0, 3) for row in paper_beam_search(model, tokenizer, TEXTS[start : start + 3])]
    records = translate(TEXTS, batch_size=3, return_tensors=True)
    assert len(records) == len(TEXTS)
    for record, expected_ids in zip(records, expected):
        assert torch.equal(record["translation_token_ids"], expected_ids)
    assert translate(TEXTS, batch_size=3) == [
        {"translation_text": tokenizer.decode(ids, skip_special_tokens=True)} for ids in expected
    ]


@pytest.mark.floor
def test_generation_parameters_reach_generate_per_call_and_per_pipeline(translator, translate):
    model, tokenizer = translator
    greedy = paper_beam_search(model, tokenizer, [TEXTS[2]], num_beams=1, max_new_tokens=4)[0]
    assert len(greedy) == 5  # decoder start + 4 tokens: the limit was applied
    [per_call] = translate(TEXTS[2], num_beams=1, max_new_tokens=4, return_tensors=True)
    assert torch.equal(per_call["translation_token_ids"], greedy)
    greedy_pipeline = pipeline(TASK, model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=4)
    [per_pipeline] = greedy_pipeline(TEXTS[2], return_tensors=True)
    assert torch.equal(per_pipeline["translation_token_ids"], greedy)


def test_return_dict_in_generate_still_gives_the_translations(translator, translate):
    """generate() then returns a ModelOutput, which the pipeline reshaped as a tensor (AttributeError)."""
    model, tokenizer = translator
    expected = tokenizer.batch_decode(paper_beam_search(model, tokenizer, [TEXTS[1]]), skip_special_tokens=True)
    for settings in (dict(return_dict_in_generate=True), dict(return_dict_in_generate=True, output_scores=True)):
        assert translate(TEXTS[1], **settings) == [{"translation_text": expected[0]}]


@pytest.mark.floor
def test_a_calls_generation_config_replaces_the_pipelines_generation_parameters(translator):
    """As in a direct generate() call: a generation_config comes whole, without the parameters set aside."""
    model, tokenizer = translator
    greedy_pipeline = pipeline(TASK, model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=4)
    config = copy.deepcopy(model.generation_config)
    config.update(num_beams=2, max_new_tokens=6)
    [result] = greedy_pipeline(TEXTS[2], generation_config=config, return_tensors=True)
    expected = paper_beam_search(model, tokenizer, [TEXTS[2]], num_beams=2, max_new_tokens=6)[0]
    assert torch.equal(result["translation_token_ids"], expected)
    [own] = greedy_pipeline(TEXTS[2], return_tensors=True)  # what the pipeline's parameters give
    assert not torch.equal(own["translation_token_ids"], expected)


def test_num_return_sequences_gives_that_many_translations_best_first(translator, translate):
    model, tokenizer = translator
    expected = paper_beam_search(model, tokenizer, [TEXTS[1]], num_return_sequences=3)
    records = translate(TEXTS[1], num_return_sequences=3)
    texts = tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert records == [{"translation_text": text} for text in texts]
    assert translate([TEXTS[1], TEXTS[3]], num_return_sequences=2)[1] == [
        {"translation_text": text}
        for text in tokenizer.batch_decode(
            paper_beam_search(model, tokenizer, [TEXTS[3]], num_return_sequences=2), skip_special_tokens=True
        )
    ]


def test_blank_texts_translate_as_empty_alone_in_a_batch_and_in_n_best_lists(translate):
    """A text of spaces was translated into whatever the model made of them (a blank line of a document became
    invented words); `translate` leaves a blank line blank, and so does the pipeline now. The other sentences of
    their batch translate as alone."""
    alone = translate(TEXTS[0])[0]
    assert translate("   ") == [{"translation_text": ""}]
    assert (
        translate(["   ", TEXTS[0], "", "\t"], batch_size=2)
        == [{"translation_text": ""}, alone] + [{"translation_text": ""}] * 2
    )
    assert translate(["  ", TEXTS[0]], batch_size=2, num_return_sequences=2)[0] == [{"translation_text": ""}] * 2


def test_language_codes_go_to_tokenizers_that_have_them(translator):
    # Tokenizers of multilingual models (NLLB, M2M100, mBART) build their inputs with
    # `_build_translation_inputs` and return the target language as `forced_bos_token_id`.
    model, tokenizer = translator
    multilingual = copy.deepcopy(tokenizer)
    language_ids, calls = {"de": 42}, []

    def build_translation_inputs(raw_inputs, return_tensors, src_lang, tgt_lang, **kwargs):
        calls.append((raw_inputs, src_lang, tgt_lang))
        inputs = multilingual(raw_inputs, return_tensors=return_tensors, **kwargs)
        inputs["forced_bos_token_id"] = language_ids[tgt_lang]
        return inputs

    multilingual._build_translation_inputs = build_translation_inputs
    translate = pipeline(TASK, model=model, tokenizer=multilingual)
    records = translate(TEXTS[:2], src_lang="en", tgt_lang="de", batch_size=2, return_tensors=True)
    assert sorted(calls) == sorted((text, "en", "de") for text in TEXTS[:2])
    for record in records:  # the first token after the decoder start is the forced language token
        assert record["translation_token_ids"][1].item() == language_ids["de"]


def test_language_codes_are_refused_by_a_tokenizer_without_them(translate):
    with pytest.raises(ValueError, match="src_lang/tgt_lang were given"):
        translate(TEXTS[0], src_lang="en", tgt_lang="de")


@pytest.mark.floor
def test_a_generator_of_sentences_streams_the_same_translations(translate):
    read = []

    def sentences():
        for text in TEXTS[:3]:
            read.append(text)
            yield text

    streamed = translate(sentences())
    first = next(streamed)
    assert len(read) < 3  # the first translation came before the generator was read to its end
    assert [first, *streamed] == translate(TEXTS[:3])


def test_a_tuple_translates_as_a_list_and_no_sentences_give_no_translations(translate):
    assert translate(tuple(TEXTS[:2])) == translate(TEXTS[:2])
    assert translate([]) == [] and translate(()) == []


def test_truncation_cuts_at_the_models_positions_with_a_tokenizer_built_in_memory(translator, translate):
    """A tokenizer from train_tokenizer keeps model_max_length 1024 until saved with a model; truncation=True
    then left a 300-token input longer than the model's 128 positions, and the model's error advised
    truncation=True. The reference: generate() on the input cut to 128 tokens."""
    model, tokenizer = translator
    text = " ".join(["a small text to learn"] * 60)
    assert len(tokenizer(text)["input_ids"]) > model.config.max_position_embeddings < tokenizer.model_max_length
    settings = dict(num_beams=1, max_new_tokens=5)
    with torch.no_grad():
        cut = tokenizer([text], truncation=True, max_length=model.config.max_position_embeddings, return_tensors="pt")
        expected = tokenizer.decode(model.generate(**cut, **settings)[0], skip_special_tokens=True)
    assert translate(text, truncation=True, **settings) == [{"translation_text": expected}]


@pytest.mark.parametrize(
    "inputs", [torch.tensor([[5, 6, 3]]), [b"bytes"], {"text": "A man."}], ids=["ids", "bytes", "dict"]
)
def test_input_that_is_not_text_is_refused(translate, inputs):
    with pytest.raises(TypeError, match="translates strings"):
        translate(inputs)


# ---------------------------------------------------------------------------------------------
# Checkpoints carry the pipeline
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(translator, tmp_path_factory):
    model, tokenizer = translator
    folder = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_saved_checkpoint_holds_the_pipeline_file_and_declares_the_translation_task(checkpoint):
    assert (checkpoint / "pipeline_vanilla_transformer.py").read_text() == inspect.getsource(pipeline_module)
    assert json.loads((checkpoint / "config.json").read_text())["custom_pipelines"] == DECLARED_PIPELINES


def test_installed_package_serves_a_checkpoint_under_its_own_task_name(translator, checkpoint):
    model, tokenizer = translator
    translate = pipeline(TASK, model=str(checkpoint))
    assert type(translate) is VanillaTranslationPipeline  # the installed class, not the checkpoint's copy
    expected = paper_beam_search(model, tokenizer, TEXTS[:2])
    assert translate(TEXTS[:2]) == [
        {"translation_text": text} for text in tokenizer.batch_decode(expected, skip_special_tokens=True)
    ]
    # The declared name runs the checkpoint's copy, which transformers never does unasked.
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("translation", model=str(checkpoint))


@pytest.mark.floor
def test_without_the_package_a_checkpoint_translates_with_its_own_pipeline_file(translator, checkpoint, tmp_path):
    model, tokenizer = translator
    code = f"""
    import json, os
    os.environ["HF_MODULES_CACHE"] = {str(tmp_path / "modules")!r}  # the copied files stay in the test folder
    import torch
    from transformers import pipeline
    torch.set_num_threads(1)
    translate = pipeline("translation", model={str(checkpoint)!r}, trust_remote_code=True)
    print(json.dumps([type(translate).__module__, translate({TEXTS[:2]!r})]))
    """
    module, translations = json.loads(run_without_package(textwrap.dedent(code), cwd=tmp_path).splitlines()[-1])
    assert module.startswith("transformers_modules.") and module.endswith(".pipeline_vanilla_transformer")
    expected = paper_beam_search(model, tokenizer, TEXTS[:2])
    assert translations == [
        {"translation_text": text} for text in tokenizer.batch_decode(expected, skip_special_tokens=True)
    ]


def test_pipeline_save_pretrained_declares_translation_not_the_registered_name(translate, tmp_path):
    translate.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["custom_pipelines"] == DECLARED_PIPELINES
    saved = {path.name for path in tmp_path.iterdir()}
    assert {"pipeline_vanilla_transformer.py", "model.safetensors", "tokenizer.json"} <= saved
    assert type(pipeline(TASK, model=str(tmp_path))) is VanillaTranslationPipeline


# ---------------------------------------------------------------------------------------------
# A tokenizer that does not belong to the model
# ---------------------------------------------------------------------------------------------


def test_the_trained_tokenizer_matches_its_model(translator, caplog):
    model, tokenizer = translator
    assert check_tokenizer_matches_model(tokenizer, model.config) is None
    assert not caplog.records


def test_a_tokenizer_smaller_than_the_target_vocabulary_is_warned_about(translator, caplog):
    """Ids past the tokenizer's end decode to nothing: a word the model emits there vanishes silently."""
    _, tokenizer = translator
    size = len(tokenizer)
    assert tokenizer.decode([size + 3]) == ""  # the reference: what the user would otherwise never see
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=size + 8)
    assert check_tokenizer_matches_model(tokenizer, config) is None
    assert f"The tokenizer has {size} tokens, fewer than the model's {size + 8}" in caplog.text
    assert f"ids {size}..{size + 7} decode to nothing" in caplog.text


def test_disagreeing_special_ids_are_each_named(translator):
    _, tokenizer = translator
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), pad_token_id=1, eos_token_id=5)
    with pytest.raises(ValueError, match="does not match the model") as error:
        check_tokenizer_matches_model(tokenizer, config)
    message = str(error.value)
    assert "'<pad>' has id 0, but the model's pad_token_id is 1" in message
    assert "'</s>' has id 3, but the model's eos_token_id is 5" in message
    assert "bos_token_id" not in message.split("Load the tokenizer")[0]  # <s> agrees (id 2)
    assert "AutoTokenizer.from_pretrained" in message


def test_a_tokenizer_of_separate_vocabularies_is_not_warned_about(translator, caplog):
    """MarianTokenizer(separate_vocabs=True) counts its source vocabulary in len(), and decodes with its target
    one: a converted model of separate vocabularies was warned about on every run."""
    import copy

    _, tokenizer = translator
    separate = copy.deepcopy(tokenizer)
    separate.separate_vocabs = True
    size = len(tokenizer)
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=size, decoder_vocab_size=size + 8, share_encoder_decoder_embeddings=False
    )
    check_tokenizer_matches_model(tokenizer, config)
    assert "fewer than the model's" in caplog.text  # the reference: the same sizes with a joint vocabulary
    caplog.clear()
    check_tokenizer_matches_model(separate, config)
    assert not caplog.records


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(translator):
    _, tokenizer = translator
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer) - 10)
    expected = f"has {len(tokenizer)} tokens, more than the model's vocab_size={len(tokenizer) - 10}"
    with pytest.raises(ValueError, match=expected):
        check_tokenizer_matches_model(tokenizer, config)


def test_the_pipeline_refuses_a_tokenizer_of_another_model(translator):
    _, tokenizer = translator
    other = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), eos_token_id=5, d_model=32)
    )
    with pytest.raises(ValueError, match="eos_token_id is 5"):
        pipeline(TASK, model=other, tokenizer=tokenizer)
