"""Interoperability: MarianMT checkpoints imported exactly, export to CTranslate2.

References: `MarianMTModel` itself, built from random configs with random weights (LayerNorms
included, so that a wrong permutation cannot hide): logits and `generate()` on a padded batch; and
`ctranslate2.Translator` on the exported directory: `score_batch` log-probabilities (teacher forcing)
and `translate_batch` greedy / beam-4 outputs of small models trained here on a copy task.
"""

import re
import sys

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerFast,
)

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer
from vanilla_transformer.command_line import install_command
from vanilla_transformer.convert import convert_marian, from_marian, main, marian_to_interleaved, to_ctranslate2
from vanilla_transformer.modeling_vanilla_transformer import sinusoidal_positions
from vanilla_transformer.tokenization_vanilla_transformer import MIN_VOCAB_SIZE

ctranslate2 = pytest.importorskip("ctranslate2")

MARIAN_VOCAB, MARIAN_PAD, MARIAN_EOS = 50, 49, 0  # Marian's habit: </s> first, <pad> last


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster on one thread, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- MarianMT models with random weights ------------------------------------------------------------


def random_marian(seed: int = 0, final_logits_bias: bool = False, **overrides) -> MarianMTModel:
    defaults = dict(
        vocab_size=MARIAN_VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=24,
        decoder_ffn_dim=20,
        max_position_embeddings=64,
        pad_token_id=MARIAN_PAD,
        eos_token_id=MARIAN_EOS,
        decoder_start_token_id=MARIAN_PAD,
        activation_function="swish",
        scale_embedding=True,
        dropout=0.1,
        attention_dropout=0.1,
    )
    torch.manual_seed(seed)
    marian = MarianMTModel(MarianConfig(**{**defaults, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in marian.named_parameters():
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
            elif "embed_positions" not in name:
                parameter.normal_(0, 0.3)  # LayerNorm biases and the <pad> rows too
        if final_logits_bias:
            marian.final_logits_bias.normal_(0, 1.0)
    return marian


def marian_batch():
    """Three sources, two of them right-padded (masked); ids 1-38 avoid </s> and every case's <pad>."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 39, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in ((1, 6), (2, 4)):
        input_ids[row, length:], attention_mask[row, length:] = MARIAN_PAD, 0
    return input_ids, attention_mask


SEPARATE = dict(
    share_encoder_decoder_embeddings=False, decoder_vocab_size=40, pad_token_id=39, decoder_start_token_id=39
)
MARIAN_CASES = {
    "shared-tied-swish": dict(),
    "relu-unscaled-deeper-encoder": dict(
        activation_function="relu", scale_embedding=False, encoder_layers=3, decoder_layers=1
    ),
    "separate-vocabularies-tied": SEPARATE,
    "separate-vocabularies-untied": dict(SEPARATE, tie_word_embeddings=False),
    "shared-untied": dict(tie_word_embeddings=False),
    "final-logits-bias": dict(final_logits_bias=True, encoder_attention_heads=4, decoder_attention_heads=2),
}


@pytest.mark.parametrize("case", MARIAN_CASES)
@torch.no_grad()
def test_marian_logits_are_reproduced_in_float32(case):
    marian = random_marian(**MARIAN_CASES[case])
    ours = from_marian(marian)
    input_ids, attention_mask = marian_batch()
    decoder_input_ids = torch.randint(1, 39, (3, 7), generator=torch.Generator().manual_seed(2))
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    difference = (ours(**inputs).logits - marian(**inputs).logits).abs().max().item()
    assert difference < 1e-4


@pytest.mark.parametrize("settings", [dict(num_beams=1, do_sample=False), dict(num_beams=4)], ids=["greedy", "beam4"])
@pytest.mark.parametrize("case", MARIAN_CASES)
def test_marian_generation_is_identical_on_a_padded_batch(case, settings):
    marian = random_marian(**MARIAN_CASES[case])
    ours = from_marian(marian)
    input_ids, attention_mask = marian_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **settings)
    expected = marian.generate(**inputs)
    assert expected[:, 0].eq(marian.config.decoder_start_token_id).all()  # Marian starts from <pad>
    assert torch.equal(ours.generate(**inputs), expected)


@pytest.mark.parametrize("generation", ["opus-mt", "transformers-default"])
def test_without_a_length_given_the_converted_model_stops_where_marian_does(generation, tmp_path):
    """Marian's generation config limits the output with max_length (opus-mt: 512, with a forced </s> at the
    end); the converted model once cut every output at input length + 50 (§6.1's rule, our default) instead.
    The same after saving and loading the converted folder."""
    marian = random_marian(max_position_embeddings=512)
    if generation == "opus-mt":  # opus-mt-en-de's generation_config.json, with this vocabulary's ids
        marian.generation_config = GenerationConfig(
            bad_words_ids=[[MARIAN_PAD]],
            bos_token_id=0,
            decoder_start_token_id=MARIAN_PAD,
            eos_token_id=MARIAN_EOS,
            forced_eos_token_id=MARIAN_EOS,
            max_length=512,
            num_beams=4,
            pad_token_id=MARIAN_PAD,
            renormalize_logits=True,
        )
    input_ids, attention_mask = marian_batch()
    expected = marian.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1)
    ours = from_marian(marian)
    assert torch.equal(ours.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1), expected)
    ours.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(reloaded.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1), expected)


def test_marian_position_table_is_ours_with_sines_and_cosines_in_halves():
    table = random_marian().model.encoder.embed_positions.weight  # Marian's own table
    torch.testing.assert_close(table[:, marian_to_interleaved(16)], sinusoidal_positions(64, 16), atol=1e-6, rtol=0)
    torch.testing.assert_close(table[:, :8], sinusoidal_positions(64, 16)[:, 0::2], atol=1e-6, rtol=0)  # sines first


@pytest.mark.parametrize(
    "share, tie, expected",
    [
        (True, True, (True, True)),
        (False, True, (False, True)),
        (False, False, (False, False)),
        (True, False, (False, False)),
    ],  # transformers 5 unties all three matrices when tie_word_embeddings=False
)
def test_sharing_and_tying_follow_the_tensors_marian_uses(share, tie, expected):
    overrides = {**({} if share else SEPARATE), "share_encoder_decoder_embeddings": share, "tie_word_embeddings": tie}
    config = from_marian(random_marian(**overrides)).config
    assert (config.share_encoder_decoder_embeddings, config.tie_word_embeddings) == expected


def test_zero_final_logits_bias_is_dropped_and_nonzero_is_folded_into_an_untied_projection():
    assert from_marian(random_marian()).config.tie_word_embeddings
    marian = random_marian(final_logits_bias=True)
    ours = from_marian(marian)
    assert not ours.config.tie_word_embeddings
    input_ids, _ = marian_batch()
    with torch.no_grad():
        logits = ours(input_ids=input_ids, decoder_input_ids=input_ids[:, :3]).logits
        marian.final_logits_bias.zero_()
        without_bias = marian(input_ids=input_ids, decoder_input_ids=input_ids[:, :3]).logits
    assert (logits - without_bias).abs().max() > 1  # the bias matters, and the parity tests see it


def test_converted_config_copies_marian_ids_dropouts_and_generation_config():
    marian = random_marian(dropout=0.2, attention_dropout=0.05, activation_dropout=0.15)
    marian.generation_config.num_beams = 6
    config = from_marian(marian).config
    ids = (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id)
    assert ids == (MARIAN_PAD, MARIAN_EOS, MARIAN_PAD)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.2, 0.05, 0.15)
    assert (config.layer_norm_eps, config.max_position_embeddings, config.activation_function) == (1e-5, 64, "swish")
    assert from_marian(marian).generation_config.num_beams == 6


# --- MarianMT variants that are refused -------------------------------------------------------------


def zero_layer_norm_weight(marian):
    with torch.no_grad():
        marian.model.decoder.layers[-1].final_layer_norm.weight[3] = 0
    return marian


def tamper_positions(marian):
    with torch.no_grad():
        marian.model.decoder.embed_positions.weight[5, 2] += 0.5
    return marian


REFUSALS = {
    "pre-norm": (dict(normalize_before=True), lambda m: m, "normalize_before"),
    "layernorm-embedding": (dict(normalize_embedding=True), lambda m: m, "normalize_embedding"),
    "final-layer-norm": (dict(add_final_layer_norm=True), lambda m: m, "add_final_layer_norm"),
    "learned-positions": (dict(static_position_embeddings=False), lambda m: m, "static_position_embeddings"),
    "layerdrop": (dict(encoder_layerdrop=0.1), lambda m: m, "encoder_layerdrop"),
    "several-eos": (dict(eos_token_id=[0, 1]), lambda m: m, "eos_token_id"),
    "odd-d-model": (dict(d_model=15, encoder_attention_heads=3, decoder_attention_heads=3), lambda m: m, "d_model=15"),
    "shared-with-two-sizes": (
        dict(decoder_vocab_size=40, pad_token_id=39, decoder_start_token_id=39),
        lambda m: m,
        "decoder_vocab_size=40",
    ),
    "tampered-positions": (dict(), tamper_positions, "embed_positions"),
    "bias-with-zero-layer-norm-weight": (dict(final_logits_bias=True), zero_layer_norm_weight, "final_logits_bias"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_unsupported_marian_variants_are_refused_naming_the_field(case):
    overrides, change, field = REFUSALS[case]
    marian = change(random_marian(**overrides))
    with pytest.raises(ValueError, match=field):
        from_marian(marian)


def test_a_model_that_is_not_marian_is_refused():
    with pytest.raises(TypeError, match="MarianMTModel"):
        from_marian(VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")))


def test_a_folder_of_another_model_is_refused_naming_it(tmp_path):
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{tmp_path} describes a 'vanilla_transformer' model .*not a MarianMT one"):
        from_marian(str(tmp_path))


def marian_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level stand-in for the sentencepiece MarianTokenizer, with Marian's id layout."""
    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, MARIAN_PAD)}, "<pad>": MARIAN_PAD}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def test_a_tokenizer_with_other_special_ids_is_refused():
    marian = random_marian(pad_token_id=48, decoder_start_token_id=48)
    with pytest.raises(ValueError, match="pad_token_id=49 differs from the model's pad_token_id=48"):
        from_marian(marian, marian_tokenizer())


# --- command line: from-marian ----------------------------------------------------------------------


def test_cli_from_marian_writes_a_hub_folder_that_reloads_with_the_same_logits(tmp_path):
    marian = random_marian(final_logits_bias=True)
    marian.save_pretrained(tmp_path / "marian")
    marian_tokenizer().save_pretrained(tmp_path / "marian")
    main(["from-marian", str(tmp_path / "marian"), str(tmp_path / "out")])
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    assert isinstance(reloaded, VanillaTransformerForConditionalGeneration)
    assert AutoTokenizer.from_pretrained(tmp_path / "out").convert_ids_to_tokens([0, 5, 49]) == ["</s>", "w5", "<pad>"]
    input_ids, attention_mask = marian_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4])
    with torch.no_grad():
        assert (reloaded(**inputs).logits - marian(**inputs).logits).abs().max() < 1e-4


def test_cli_from_marian_without_a_loadable_tokenizer_fails_clearly_unless_told_to_skip_it(tmp_path, capsys):
    random_marian().save_pretrained(tmp_path / "marian")
    with pytest.raises(SystemExit) as exit_info:
        main(["from-marian", str(tmp_path / "marian"), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "Could not load the Marian tokenizer" in capsys.readouterr().err
    main(["from-marian", str(tmp_path / "marian"), str(tmp_path / "out"), "--no-tokenizer"])
    assert (tmp_path / "out" / "config.json").exists() and not (tmp_path / "out" / "tokenizer_config.json").exists()
    (tmp_path / "a-file").write_text("")  # save_pretrained only logs an error for a file, and nothing is saved
    with pytest.raises(SystemExit) as exit_info:
        main(["from-marian", str(tmp_path / "marian"), str(tmp_path / "a-file"), "--no-tokenizer"])
    assert exit_info.value.code == 2 and "a-file is a file; give a folder" in capsys.readouterr().err
    with pytest.raises(NotADirectoryError, match="a-file is a file"):
        convert_marian(tmp_path / "marian", tmp_path / "a-file")


# --- CTranslate2: teacher-forced log-probabilities ----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    """Our byte-level BPE with nothing merged: 256 byte pieces after <pad> <unk> <s> </s>."""
    return train_tokenizer(["abc"], vocab_size=MIN_VOCAB_SIZE, min_frequency=100)


def random_model(vocab_size: int, seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    defaults = dict(
        vocab_size=vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**{**defaults, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
            else:
                parameter.normal_(0, 0.3)
    return model


def translator(directory) -> "ctranslate2.Translator":
    return ctranslate2.Translator(str(directory), device="cpu", compute_type="float32", intra_threads=1)


def ct2_log_probs(directory, tokenizer, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
    """CTranslate2 adds the decoder start token before and </s> after each target."""
    pieces = tokenizer.convert_ids_to_tokens
    results = translator(directory).score_batch([pieces(s) for s in sources], [pieces(t) for t in targets])
    return [result.log_probs for result in results]


@torch.no_grad()
def our_log_probs(model, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    labels = [t + [eos] for t in targets]
    width_source, width_target = max(map(len, sources)), max(map(len, labels))
    input_ids = torch.tensor([s + [pad] * (width_source - len(s)) for s in sources])
    label_ids = torch.tensor([t + [-100] * (width_target - len(t)) for t in labels])
    logits = model(input_ids=input_ids, attention_mask=(input_ids != pad).long(), labels=label_ids).logits
    log_probs = logits.log_softmax(-1)
    return [log_probs[i, torch.arange(len(t)), t].tolist() for i, t in enumerate(labels)]


SOURCES = [[10, 11, 12, 13, 14, 3], [20, 30, 40, 3]]
TARGETS = [[50, 51, 52, 53], [60, 61]]
EXPORT_CASES = {
    "post-LN": dict(),
    "pre-LN": dict(normalize_before=True),
    "learned-positions-swish": dict(position_embedding_type="learned", activation_function="swish"),
    "head-dim-4": dict(head_dim=4),
    "separate-vocabularies-padded": dict(
        share_encoder_decoder_embeddings=False, tie_word_embeddings=False, vocab_size=263, decoder_vocab_size=270
    ),
}


@pytest.mark.parametrize("case", EXPORT_CASES)
def test_ctranslate2_log_probabilities_equal_ours(case, tokenizer, tmp_path):
    model = random_model(**{"vocab_size": len(tokenizer), **EXPORT_CASES[case]})
    separate = not model.config.share_encoder_decoder_embeddings
    to_ctranslate2(model, tmp_path, tokenizer=tokenizer, target_tokenizer=tokenizer if separate else None)
    theirs = ct2_log_probs(tmp_path, tokenizer, SOURCES, TARGETS)
    for ours_row, theirs_row in zip(our_log_probs(model, SOURCES, TARGETS), theirs):
        assert len(theirs_row) == len(ours_row)
        assert max(abs(a - b) for a, b in zip(ours_row, theirs_row)) < 1e-4


def test_marian_to_ctranslate2_keeps_marian_log_probabilities(tmp_path):
    """The whole chain, with Marian's <pad> start token and a folded final_logits_bias."""
    marian = random_marian(final_logits_bias=True)
    to_ctranslate2(from_marian(marian), tmp_path, tokenizer=marian_tokenizer())
    sources, targets = [[5, 6, 7, 8, 0], [9, 10, 0]], [[11, 12, 13], [14]]
    theirs = ct2_log_probs(tmp_path, marian_tokenizer(), sources, targets)
    for ours_row, theirs_row in zip(our_log_probs(marian, sources, targets), theirs):
        assert max(abs(a - b) for a, b in zip(ours_row, theirs_row)) < 1e-4


# --- CTranslate2: decoding with a trained model -------------------------------------------------------

ALPHABET = torch.arange(60, 72)  # twelve byte pieces


def copy_batch(generator: torch.Generator, size: int):
    """Sources of 2-7 random pieces + </s>; the labels are the same (a copy task)."""
    lengths = torch.randint(2, 8, (size,), generator=generator).tolist()
    input_ids = torch.zeros(size, max(lengths) + 1, dtype=torch.long)
    for row, length in enumerate(lengths):
        pieces = ALPHABET[torch.randint(0, len(ALPHABET), (length,), generator=generator)]
        input_ids[row, : length + 1] = torch.cat([pieces, torch.tensor([3])])
    return input_ids, (input_ids != 0).long(), input_ids.masked_fill(input_ids == 0, -100)


@pytest.fixture(scope="module", params=[False, True], ids=["post-LN", "pre-LN"])
def trained(request, tokenizer):
    """A model trained for 120 steps to copy its input: about half its copies are exact, none degenerate."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        normalize_before=request.param,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=4e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(120):
        input_ids, attention_mask, labels = copy_batch(generator, 32)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def until_eos(ids: list[int], eos: int = 3) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@pytest.mark.parametrize("beams", [1, 4], ids=["greedy", "beam4"])
def test_ctranslate2_decodes_like_generate(trained, beams, tokenizer, tmp_path):
    to_ctranslate2(trained, tmp_path, tokenizer=tokenizer)
    input_ids, attention_mask, _ = copy_batch(torch.Generator().manual_seed(7), 8)
    # CTranslate2 divides by |Y| ** alpha, transformers' formula, not the paper's (GNMT's) default one
    paper = dict(length_penalty=0.6, early_stopping=True, length_penalty_formula="length") if beams > 1 else {}
    out = trained.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=beams,
        max_new_tokens=20,
        output_scores=True,
        return_dict_in_generate=True,
        **paper,
    )
    ours = [until_eos(row[1:].tolist()) for row in out.sequences]  # drop the start token <s>
    sources = [tokenizer.convert_ids_to_tokens(row[row != 0].tolist()) for row in input_ids]  # unpadded
    results = translator(tmp_path).translate_batch(
        sources,
        beam_size=beams,
        length_penalty=0.6,
        return_end_token=True,
        min_decoding_length=0,
        max_decoding_length=20,
        return_scores=True,
    )
    theirs = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
    assert theirs == ours
    assert len({len(hypothesis) for hypothesis in ours}) > 2  # not degenerate: lengths follow the sources
    if beams > 1:  # both normalise the summed log-probability by (length incl. </s>) ** 0.6
        scores = torch.tensor([result.scores[0] for result in results])
        torch.testing.assert_close(scores, out.sequences_scores, atol=1e-4, rtol=0)


def test_int8_quantization_gives_a_smaller_model_that_translates(trained, tokenizer, tmp_path):
    to_ctranslate2(trained, tmp_path / "float32", tokenizer=tokenizer)
    to_ctranslate2(trained, tmp_path / "int8", tokenizer=tokenizer, quantization="int8")
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (tmp_path / "float32" / "model.bin").stat().st_size
    int8 = ctranslate2.Translator(str(tmp_path / "int8"), device="cpu", intra_threads=1)
    results = int8.translate_batch([tokenizer.convert_ids_to_tokens([60, 61, 62, 3])], beam_size=4)
    assert results[0].hypotheses[0] and set(results[0].hypotheses[0]) <= set(tokenizer.get_vocab())


def test_exporting_leaves_the_models_own_weights_as_they_were(trained, tokenizer, tmp_path):
    """spec.optimize(quantization=...) rewrites variables in place; int8 once quantised the tied embedding."""
    before = {name: tensor.clone() for name, tensor in trained.state_dict().items()}
    for quantization in (None, "int8", "int16", "float16"):
        to_ctranslate2(trained, tmp_path / str(quantization), tokenizer=tokenizer, quantization=quantization)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(tensor, before[name]), name


# --- CTranslate2: command line and errors -------------------------------------------------------------


def test_cli_to_ctranslate2_reads_model_and_tokenizer_from_a_saved_folder(tokenizer, tmp_path, capsys):
    model = random_model(len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    main(["to-ctranslate2", str(tmp_path / "model"), str(tmp_path / "ct2")])
    assert (tmp_path / "ct2" / "shared_vocabulary.json").exists()
    theirs = ct2_log_probs(tmp_path / "ct2", tokenizer, SOURCES, TARGETS)
    for ours_row, theirs_row in zip(our_log_probs(model, SOURCES, TARGETS), theirs):
        assert max(abs(a - b) for a, b in zip(ours_row, theirs_row)) < 1e-4
    with pytest.raises(SystemExit):  # an existing directory is replaced only with --force
        main(["to-ctranslate2", str(tmp_path / "model"), str(tmp_path / "ct2")])
    assert "force" in capsys.readouterr().err
    main(["to-ctranslate2", str(tmp_path / "model"), str(tmp_path / "ct2"), "--force", "--quantization", "int8"])
    config = (tmp_path / "model" / "config.json").read_text()
    for output in (tmp_path / "model", tmp_path / "ct2-into-a-model"):  # the model itself, or another model
        if output.name != "model":
            model.save_pretrained(output)
        with pytest.raises(SystemExit):  # even with --force: it would replace the model's config.json
            main(["to-ctranslate2", str(tmp_path / "model"), str(output), "--force"])
        assert "holds a transformers model (its config.json has model_type 'vanilla_transformer')" in (
            capsys.readouterr().err
        )
    assert (tmp_path / "model" / "config.json").read_text() == config and not (
        tmp_path / "model" / "model.bin"
    ).exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit):
        main(["to-ctranslate2", str(tmp_path / "model"), str(tmp_path / "a-file")])
    assert "a-file is a file; give a folder" in capsys.readouterr().err


def test_missing_ctranslate2_names_the_extra_to_install(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(install_command("ctranslate2"))):
        to_ctranslate2(random_model(len(tokenizer)), tmp_path, tokenizer=tokenizer)


EXPORT_ERRORS = {
    "activation": (dict(activation_function="tanh"), {}, "activation_function 'tanh'"),
    "no-tokenizer": (dict(), dict(tokenizer=None), "Pass tokenizer="),
    "tokenizer-too-big": (dict(vocab_size=200), {}, "260 tokens, more than the model's source vocabulary of 200"),
    "separate-without-target": (dict(share_encoder_decoder_embeddings=False), {}, "target_tokenizer"),
}


@pytest.mark.parametrize("case", EXPORT_ERRORS)
def test_export_errors_are_clear(case, tokenizer, tmp_path):
    overrides, arguments, message = EXPORT_ERRORS[case]
    model = random_model(**{"vocab_size": len(tokenizer), **overrides})
    with pytest.raises(ValueError, match=message):
        to_ctranslate2(model, tmp_path, **{"tokenizer": tokenizer, **arguments})
    assert not any(tmp_path.iterdir())  # nothing half-written
