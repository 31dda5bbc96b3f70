"""The paths a transformers user takes with the docs in hand: loading in another dtype, tuples,
resizing vocabularies, compiling, LoRA, their own Seq2SeqTrainer, generating from encoder outputs,
truncation. Each is checked against an independent reference: MarianMTModel doing the same thing,
the float32 model, the uncompiled model, or the lengths of what was generated."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    GenerationMixin,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    pipeline,
)

from helpers import REPO
from test_pipeline import SENTENCES, TEXTS, train_copying_translator
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.convert import from_marian
from vanilla_transformer.generation_vanilla_transformer import paper_generation_config


@pytest.fixture(scope="module")
def trained():
    return train_copying_translator(steps=60)


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    model, tokenizer = trained
    folder = tmp_path_factory.mktemp("saved")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# Loading and the model API
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loading_in_half_precision_puts_every_weight_and_buffer_in_it(saved, trained, dtype):
    model, tokenizer = trained
    half = AutoModelForSeq2SeqLM.from_pretrained(saved, dtype=dtype).eval()
    floating = [t for t in [*half.parameters(), *half.buffers()] if t.is_floating_point()]
    assert floating and {t.dtype for t in floating} == {dtype}
    batch = tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["input_ids"])
    with torch.no_grad():
        reference = model(**batch, decoder_input_ids=decoder_input_ids).logits
        logits = half(**batch, decoder_input_ids=decoder_input_ids).logits
    assert logits.dtype == dtype
    assert (logits.float() - reference).abs().max() < 0.1 * reference.abs().max()
    with torch.no_grad():
        generated = half.generate(**batch, num_beams=1, max_new_tokens=8)
    assert generated.shape[0] == 3


@pytest.mark.floor
def test_the_pipeline_takes_a_dtype(saved, trained):
    import vanilla_transformer  # noqa: F401  (the "vanilla-translation" task)

    translate = pipeline("vanilla-translation", model=str(saved), dtype=torch.bfloat16)
    assert translate.model.dtype == torch.bfloat16
    assert translate(SENTENCES[0], num_beams=1, max_new_tokens=6)[0]["translation_text"] is not None


def marian_and_ours(**overrides):
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=60,
        decoder_vocab_size=60,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=59,
        eos_token_id=0,
        decoder_start_token_id=59,
        forced_eos_token_id=None,
        **overrides,
    )
    marian = MarianMTModel(config).eval()
    return marian, from_marian(marian).eval()


def test_return_dict_false_gives_the_tuple_marian_gives():
    marian, ours = marian_and_ours()
    inputs = dict(input_ids=torch.tensor([[5, 6, 7, 0]]), labels=torch.tensor([[8, 9, 0]]))
    with torch.no_grad():
        expected, got = marian(**inputs, return_dict=False), ours(**inputs, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(expected)
    torch.testing.assert_close(got[0], expected[0])  # loss
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-5)  # logits
    with torch.no_grad():
        base = ours.model(input_ids=inputs["input_ids"], decoder_input_ids=inputs["labels"], return_dict=False)
    assert isinstance(base, tuple) and base[0].shape == (1, 3, 16)


LAYOUTS = list(itertools.product([True, False], [True, False]))  # (shared vocabulary, tied projection)


@pytest.mark.parametrize("shared, tied", LAYOUTS)
def test_resizing_every_vocabulary_layout_as_marian_does_and_through_save_load(shared, tied, tmp_path):
    separate = {} if shared else {"decoder_vocab_size": 50}
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=60,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
        **separate,
    )
    ours = VanillaTransformerForConditionalGeneration(config).eval()
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=60,
            decoder_vocab_size=50 if not shared else 60,
            d_model=16,
            share_encoder_decoder_embeddings=shared,
            tie_word_embeddings=tied,
            encoder_layers=1,
            decoder_layers=1,
            pad_token_id=0,
        )
    )
    old_source = ours.get_input_embeddings().weight[:60].clone()
    for model in (ours, marian):
        model.resize_token_embeddings(75, mean_resizing=False)
        if not shared:
            model.resize_decoder_token_embeddings(70)

    def sizes(model, decoder_embedding):
        return (
            model.get_input_embeddings().weight.shape[0],
            decoder_embedding.weight.shape[0],
            model.get_output_embeddings().weight.shape[0],
            model.config.vocab_size,
            model.config.decoder_vocab_size,
        )

    assert sizes(ours, ours.model.decoder.embedding.token_embedding) == sizes(marian, marian.model.decoder.embed_tokens)
    assert (
        sizes(ours, ours.model.decoder.embedding.token_embedding) == (75, 75, 75, 75, 75)
        if shared
        else (75, 70, 70, 75, 70)
    )
    torch.testing.assert_close(ours.get_input_embeddings().weight[:60], old_source)  # old rows kept
    assert (ours.lm_head.weight is ours.model.decoder.embedding.token_embedding.weight) == tied
    assert ours.model.encoder.embedding.token_embedding.weight is ours.model.shared.weight
    ours.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    inputs = dict(input_ids=torch.tensor([[74, 3]]), decoder_input_ids=torch.tensor([[2, 69 if not shared else 74]]))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, ours(**inputs).logits)


def test_resizing_a_shared_vocabulary_through_the_decoder_is_refused():
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=50))
    with pytest.raises(ValueError, match="resize both with resize_token_embeddings"):
        model.resize_decoder_token_embeddings(60)


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_fullgraph_compile_with_a_static_cache_decodes_as_eager(trained, num_beams):
    model, tokenizer = trained
    assert model._can_compile_fullgraph
    batch = tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    settings = dict(num_beams=num_beams, max_new_tokens=12, cache_implementation="static")
    with torch.no_grad():
        eager = model.generate(**batch, **settings)
        model.forward = torch.compile(model.forward, fullgraph=True)
        try:
            compiled = model.generate(**batch, **settings)
        finally:
            del model.forward  # back to the class's method
    assert torch.equal(compiled, eager)


def test_lora_fine_tunes_the_named_attention_projections(trained):
    peft = pytest.importorskip("peft")
    model, tokenizer = trained
    model = VanillaTransformerForConditionalGeneration(model.config)  # a fresh copy to wrap
    lora = peft.get_peft_model(
        model, peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=4, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"])
    )
    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    batch = tokenizer(SENTENCES[:2], text_target=SENTENCES[:2], padding=True, return_tensors="pt")
    lora(**batch).loss.backward()
    assert all(p.grad is not None for name, p in lora.named_parameters() if p.requires_grad)
    assert lora.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), max_new_tokens=3).shape[0] == 1


# ---------------------------------------------------------------------------------------------
# Generation length: the paper's input + 50 survives the Trainer and every way of giving the source
# ---------------------------------------------------------------------------------------------


def long_pairs(count: int, length: int) -> list[str]:
    rng = np.random.default_rng(0)
    words = "a b c d e f g h".split()
    return [" ".join(rng.choice(words, size=length)) for _ in range(count)]


@pytest.mark.floor
def test_a_users_seq2seq_trainer_does_not_cap_later_decoding_at_20_tokens(saved, tmp_path):
    from datasets import Dataset

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(saved), AutoTokenizer.from_pretrained(saved)
    model.generation_config = paper_generation_config(model.config)  # as a model built in the script has it
    texts = long_pairs(4, 30)
    dataset = Dataset.from_dict(
        {"input_ids": tokenizer(texts)["input_ids"], "labels": tokenizer(text_target=texts)["input_ids"]}
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        report_to="none",
        use_cpu=True,
        per_device_eval_batch_size=4,
    )
    generated_lengths = []

    def compute_metrics(prediction):  # as run_translation.py counts: every token that is not padding
        generated_lengths.extend(np.count_nonzero(prediction.predictions != tokenizer.pad_token_id, axis=1))
        return {"gen_len": float(np.mean(generated_lengths))}

    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=compute_metrics,
    )
    metrics = trainer.evaluate(num_beams=1, min_new_tokens=25)
    assert model.generation_config.max_length == 20  # what Seq2SeqTrainer leaves behind
    assert min(generated_lengths) > 21 and metrics["eval_gen_len"] > 21
    trainer.save_model(str(tmp_path / "saved"))
    for decoder in (model, AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved")):
        with torch.no_grad():
            generated = decoder.generate(**tokenizer(texts[:1], return_tensors="pt"), num_beams=1, min_new_tokens=25)
        assert generated.shape[1] > 21
    # A reader that obeys the saved generation config's max_length (CTranslate2's converter, serving stacks):
    # it no longer says 20; it says the longest §6.1's rule allows, beside the rule itself.
    saved_config = GenerationConfig.from_pretrained(tmp_path / "saved")
    assert saved_config.max_length == model.config.max_position_embeddings
    assert saved_config.max_new_tokens_beyond_input == 50
    with torch.no_grad():
        obeying = GenerationMixin.generate(
            model,
            **tokenizer(texts[:1], return_tensors="pt"),
            generation_config=saved_config,
            num_beams=1,
            min_new_tokens=25,
        )
    assert obeying.shape[1] > 21
    assert model.generation_config.max_length == 20  # saving changed nothing in the user's model


def test_a_trainers_prediction_without_labels_leaves_out_the_cache_as_marians_does(tmp_path):
    """Without labels, and with the cache on (the Trainer turns it off in the config; a batch can turn it
    back on), the forward returns its key/value cache. The Trainer leaves it out of the predictions by the
    config's `keys_to_ignore_at_inference`, and the cache's name changed in transformers 5.24."""
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=40,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            pad_token_id=0,
            eos_token_id=3,
            decoder_start_token_id=0,
            max_position_embeddings=64,
        )
    ).eval()
    inputs = {
        "input_ids": torch.tensor([[5, 6, 7, 3]]),
        "decoder_input_ids": torch.tensor([[0, 5, 6]]),
        "use_cache": True,
    }
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    predicted = {}
    for name, model in (("marian", marian), ("ours", from_marian(marian))):
        _, logits, _ = Seq2SeqTrainer(model=model, args=args).prediction_step(model, dict(inputs), False)
        predicted[name] = logits
    assert all(torch.is_tensor(tensor) for tensor in predicted["ours"])
    assert [tensor.shape for tensor in predicted["ours"]] == [tensor.shape for tensor in predicted["marian"]]
    torch.testing.assert_close(predicted["ours"][0], predicted["marian"][0])  # the logits (hidden states are
    # the same up to `from_marian`'s permutation of the model dimension)


@pytest.mark.floor
def test_the_trainers_generation_length_counts_what_beam_search_generated(trained, tmp_path):
    """gen_len counts non-pad tokens (run_translation.py): beam outputs padded with </s> inflated it."""
    from datasets import Dataset

    model, tokenizer = trained
    texts = ["a", SENTENCES[1], "b c", SENTENCES[3]]
    dataset = Dataset.from_dict(
        {"input_ids": tokenizer(texts)["input_ids"], "labels": tokenizer(text_target=texts)["input_ids"]}
    )
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.predictions)
        return {"gen_len": float(np.mean(np.count_nonzero(prediction.predictions != tokenizer.pad_token_id, axis=1)))}

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        report_to="none",
        use_cpu=True,
        per_device_eval_batch_size=4,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=compute_metrics,
    )
    metrics = trainer.evaluate(num_beams=4, max_new_tokens=40)
    # Reference: each sentence decoded alone, its length up to and including </s>, plus the start token.
    lengths = []
    for text in texts:
        with torch.no_grad():
            alone = model.generate(**tokenizer([text], return_tensors="pt"), num_beams=4, max_new_tokens=40)[0].tolist()
        lengths.append(alone.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in alone else len(alone))
    assert metrics["eval_gen_len"] == pytest.approx(np.mean(lengths))
    assert len(set(lengths)) > 1  # different lengths in one batch: the case the </s> padding broke


def test_encoder_outputs_and_inputs_embeds_get_the_papers_limit_too(trained, caplog):
    model, tokenizer = trained
    batch = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    limit = batch["input_ids"].shape[1] + 50
    settings = dict(num_beams=1, min_new_tokens=limit)  # runs to the limit: + 50, not transformers' 20
    with torch.no_grad():
        expected = model.generate(**batch, **settings)
        encoder_outputs = model.get_encoder()(**batch)
        embeds = model.get_input_embeddings()(batch["input_ids"])
        with caplog.at_level(logging.WARNING):
            from_encoder = model.generate(
                encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], **settings
            )
            from_embeds = model.generate(inputs_embeds=embeds, attention_mask=batch["attention_mask"], **settings)
    assert expected.shape[1] == from_encoder.shape[1] == from_embeds.shape[1] == limit + 1
    assert torch.equal(from_encoder, expected) and torch.equal(from_embeds, expected)
    assert "max_length" not in caplog.text


def test_a_max_new_tokens_set_on_the_models_config_is_respected(trained):
    model, tokenizer = trained
    model.generation_config.max_new_tokens = 3
    try:
        with torch.no_grad():
            generated = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), num_beams=1, min_new_tokens=3)
    finally:
        model.generation_config.max_new_tokens = None
    assert generated.shape[1] == 4


def test_a_length_beyond_the_positions_is_refused_before_decoding(trained):
    model, tokenizer = trained
    with pytest.raises(ValueError, match="max_new_tokens=200 is more than this model can generate"):
        model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), max_new_tokens=200)


def test_a_length_beyond_the_positions_after_a_decoder_prompt_is_refused_before_decoding(trained):
    """The check counted the start token only: with a prompt of 3 tokens, max_new_tokens up to the positions less
    one decoded until the positions ran out, then failed."""
    model, tokenizer = trained
    positions = model.config.max_position_embeddings
    start = model.generation_config.decoder_start_token_id
    prompt = torch.tensor([[start, 10, 11]])
    with pytest.raises(ValueError, match=f"3 of them for the decoder prompt. Ask for at most {positions - 3} new"):
        model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), decoder_input_ids=prompt,
                       max_new_tokens=positions - 2, num_beams=1)  # fmt: skip
    with torch.no_grad():  # the longest it can take
        generated = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), decoder_input_ids=prompt,
                                   max_new_tokens=positions - 3, num_beams=1)  # fmt: skip
    assert generated.shape[1] <= positions


def test_beam_search_pads_finished_hypotheses_with_pad_not_eos(trained):
    """transformers fills finished beams with `pad_token_id or eos_token_id`; our pad id 0 is falsy."""
    model, tokenizer = trained
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")  # of different lengths
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=4, max_new_tokens=40)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for row in generated.tolist():
        end = row.index(eos) if eos in row else len(row) - 1
        assert all(token == pad for token in row[end + 1 :])
    assert any(pad in row for row in generated.tolist())  # some hypothesis ended early and was padded


def test_truncation_follows_the_models_positions_and_the_pipeline_takes_long_input(saved):
    import vanilla_transformer  # noqa: F401

    tokenizer = AutoTokenizer.from_pretrained(saved)
    model = AutoModelForSeq2SeqLM.from_pretrained(saved)
    assert tokenizer.model_max_length == model.config.max_position_embeddings == 128  # the model saved beside it
    long_text = " ".join(SENTENCES * 20)
    assert len(tokenizer(long_text)["input_ids"]) > 128
    ids = tokenizer(long_text, truncation=True)["input_ids"]
    assert len(ids) == 128 and ids[-1] == tokenizer.eos_token_id
    translate = pipeline("vanilla-translation", model=model, tokenizer=tokenizer)
    assert translate(long_text, truncation=True, num_beams=1, max_new_tokens=4)[0]["translation_text"] is not None
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
        translate(long_text, num_beams=1, max_new_tokens=4)


# ---------------------------------------------------------------------------------------------
# Scoring offline through evaluate
# ---------------------------------------------------------------------------------------------


@pytest.mark.floor
def test_the_shipped_metric_loads_offline_and_equals_sacrebleu(monkeypatch):
    import evaluate
    import sacrebleu

    from vanilla_transformer.training.metrics import METRIC_PATH

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hypotheses = ["Ein Hund rennt im Park.", "Zwei Männer sitzen.", ""]
    references = ["Ein Hund läuft im Park.", "Zwei Männer sitzen auf einer Bank.", "Leer."]
    result = evaluate.load(str(METRIC_PATH)).compute(predictions=hypotheses, references=references)
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed") and "tok:13a" in result["bleu_signature"]
    two = evaluate.load(str(METRIC_PATH)).compute(
        predictions=hypotheses, references=[[r, r.upper()] for r in references]
    )
    assert two["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references, [r.upper() for r in references]]).score
    )


# ---------------------------------------------------------------------------------------------
# Stock scripts: the package registered without an import in the script
# ---------------------------------------------------------------------------------------------

STOCK_SCRIPT = """
import sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
model.save_pretrained(sys.argv[2])
print(type(model).__module__)
"""


def test_the_runner_makes_a_stock_script_use_and_copy_the_installed_code(saved, tmp_path):
    import vanilla_transformer

    script = tmp_path / "stock.py"
    script.write_text(STOCK_SCRIPT)
    old_code = saved / "modeling_vanilla_transformer.py"
    stale = tmp_path / "stale"
    stale.mkdir()
    for path in saved.iterdir():  # a checkpoint carrying older code than the installed package
        (stale / path.name).write_bytes(path.read_bytes())
    (stale / old_code.name).write_text(old_code.read_text() + "\n# an older version\n")
    alone = subprocess.run(
        [sys.executable, str(script), str(stale), str(tmp_path / "a")], capture_output=True, text=True, cwd=tmp_path
    )
    assert alone.returncode != 0 and "trust_remote_code" in alone.stderr
    run = subprocess.run(
        [sys.executable, "-m", "vanilla_transformer", str(script), str(stale), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "vanilla_transformer.modeling_vanilla_transformer"  # the installed code ran
    installed = REPO / "vanilla_transformer" / "modeling_vanilla_transformer.py"
    assert installed.resolve() == (REPO / vanilla_transformer.modeling_vanilla_transformer.__file__).resolve()
    assert (tmp_path / "out" / "modeling_vanilla_transformer.py").read_text() == installed.read_text()


@pytest.mark.parametrize("name", ["no_such_module", "no_such_package.module", "vanilla_transformer.no_such_module"])
def test_the_runner_names_a_module_that_does_not_exist_in_one_line(name):
    """As `python -m` says it; runpy's ImportError once came with a traceback."""
    from vanilla_transformer.__main__ import main

    with pytest.raises(SystemExit, match=rf"^No module named '{name}'\. usage: python -m vanilla_transformer"):
        main(["-m", name])


def test_the_runner_runs_a_module_with_its_arguments(tmp_path, monkeypatch):
    from vanilla_transformer.__main__ import main

    (tmp_path / "echo_arguments.py").write_text(
        "import sys\nfrom pathlib import Path\nPath(sys.argv[1]).write_text(' '.join(sys.argv[2:]))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # runpy sets it
    main(["-m", "echo_arguments", str(tmp_path / "out.txt"), "a", "b"])
    assert (tmp_path / "out.txt").read_text() == "a b"
