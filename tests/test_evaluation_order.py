"""Evaluation and prediction decode the sentences shortest first (`LengthSortedSampler`) and give their
results back in the dataset's order: checked against a sort written out here, against each sentence decoded
alone, and against the plain Seq2SeqTrainer's pairing of predictions with labels."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer
from vanilla_transformer.training import LengthSortedSampler, TransformerTrainer, TransformerTrainingArguments
from vanilla_transformer.training.trainer import evaluation_lengths

WORDS = "the a dog cat runs sleeps on under red green small big house tree".split()


def test_the_order_is_shortest_source_first_then_shortest_target_then_input_order():
    rng = np.random.default_rng(0)
    pairs = rng.integers(1, 6, size=(200, 2))
    expected = sorted(range(len(pairs)), key=lambda i: (pairs[i, 0], pairs[i, 1], i))
    assert list(LengthSortedSampler(pairs)) == expected
    sources = pairs[:, 0]
    assert list(LengthSortedSampler(sources)) == sorted(range(len(sources)), key=lambda i: (sources[i], i))


def test_restore_order_puts_rows_back_in_the_datasets_order():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 30, size=50)
    sampler = LengthSortedSampler(lengths)
    rows = rng.normal(size=(50, 3))
    labels = rng.integers(0, 9, size=(50, 4))
    decoded = (rows[sampler.order], labels[sampler.order])  # what a loop in the sampler's order computes
    restored = sampler.restore_order(decoded)
    assert isinstance(restored, tuple)
    np.testing.assert_array_equal(restored[0], rows)
    np.testing.assert_array_equal(restored[1], labels)
    assert sampler.restore_order(None) is None
    hypotheses = np.repeat(rows, 3, axis=0)  # num_return_sequences=3: three consecutive rows a sentence
    sorted_hypotheses = hypotheses.reshape(50, 3, 3)[sampler.order].reshape(150, 3)
    np.testing.assert_array_equal(sampler.restore_order(sorted_hypotheses), hypotheses)
    with pytest.raises(ValueError, match="each of the 50 examples, got 49 rows; evaluate with --eval_order input"):
        sampler.restore_order(rows[:49])


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 15)))) for _ in range(count)]


@pytest.fixture(scope="module")
def setting():
    texts = sentences(17)
    tokenizer = train_tokenizer(iter(WORDS * 20), vocab_size=300)
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    model = VanillaTransformerForConditionalGeneration(config).eval()
    targets = texts[5:] + texts[:5]  # target lengths unrelated to the source's
    dataset = Dataset.from_dict(
        {"input_ids": tokenizer(texts)["input_ids"], "labels": tokenizer(text_target=targets)["input_ids"]}
    )
    return model, tokenizer, dataset


def trainer_of(cls, arguments, setting, tmp_path, compute_metrics=None):
    model, tokenizer, dataset = setting
    args = arguments(
        output_dir=str(tmp_path / cls.__name__),
        predict_with_generate=True,
        per_device_eval_batch_size=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    return cls(
        model=model,
        args=args,
        eval_dataset=dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=compute_metrics,
    )


def test_evaluation_decodes_batches_shortest_first_with_less_padding(setting, tmp_path):
    model, tokenizer, dataset = setting
    trainer = trainer_of(TransformerTrainer, TransformerTrainingArguments, setting, tmp_path)
    plain = trainer_of(Seq2SeqTrainer, Seq2SeqTrainingArguments, setting, tmp_path)

    def batches(of):
        return [batch["attention_mask"] for batch in of.get_eval_dataloader()]

    ours, theirs = batches(trainer), batches(plain)
    lengths = [int(n) for mask in ours for n in mask.sum(1)]
    assert lengths == sorted(lengths)
    assert sorted(lengths) == sorted(len(ids) for ids in dataset["input_ids"])  # every sentence once
    padding = [sum(int((mask == 0).sum()) for mask in masks) for masks in (ours, theirs)]
    assert padding[0] < padding[1]


def test_evaluation_decodes_with_the_models_beam_search_as_generate_does(setting, tmp_path, monkeypatch):
    """Seq2SeqTrainer passes the references (``labels``) to generate() with the source; generate() drops them (as
    transformers' own loop ignores them), so `BeamSearch` decodes every evaluation batch (it declined a call with
    model arguments beyond the source, and transformers' slower loop ran), to the same hypotheses."""
    import vanilla_transformer.generation_vanilla_transformer as generation

    model, tokenizer, dataset = setting
    reasons = []
    declines = generation.BeamSearch.not_covered
    monkeypatch.setattr(
        generation.BeamSearch, "not_covered", staticmethod(lambda *a: reasons.append(declines(*a)) or reasons[-1])
    )
    metrics = lambda prediction: {}  # noqa: E731 (with metrics to compute, evaluation generates)
    trainer = trainer_of(TransformerTrainer, TransformerTrainingArguments, setting, tmp_path, metrics)
    trainer.evaluate(num_beams=4)
    assert reasons and reasons == [None] * len(reasons)
    batch = next(iter(trainer.get_eval_dataloader()))
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with_labels = model.generate(**source, labels=batch["labels"], num_beams=4)
    reasons.clear()
    monkeypatch.setattr(generation.BeamSearch, "not_covered", staticmethod(lambda *a: "transformers' loop, please"))
    torch.testing.assert_close(with_labels, model.generate(**source, num_beams=4))  # transformers' own loop


def test_predictions_and_labels_keep_no_columns_of_padding_alone(setting, tmp_path):
    """Seq2SeqTrainer pads each batch's hypotheses and labels to the generation config's max_length (1,024 as
    `save_pretrained` writes it); ours crops the columns that hold padding alone: the same rows as
    Seq2SeqTrainer's (the reference), without them."""
    import copy
    import functools

    model, tokenizer, dataset = setting
    model = copy.deepcopy(model)
    model.generation_config.max_length = 1024
    model.generation_config.max_new_tokens = 6  # a fixed limit: the same hypotheses in any batch
    arguments = functools.partial(TransformerTrainingArguments, eval_order="input")
    ours = trainer_of(TransformerTrainer, arguments, (model, tokenizer, dataset), tmp_path).predict(dataset)
    theirs = trainer_of(Seq2SeqTrainer, Seq2SeqTrainingArguments, (model, tokenizer, dataset), tmp_path).predict(
        dataset
    )
    assert theirs.predictions.shape[1] == 1024 and ours.predictions.shape[1] < 16
    pad = tokenizer.pad_token_id
    for mine, reference in ((ours.predictions, theirs.predictions), (ours.label_ids, theirs.label_ids)):
        mine, reference = (np.where(ids < 0, pad, ids) for ids in (mine, reference))  # -100 pads across batches
        width = mine.shape[1]
        np.testing.assert_array_equal(mine, reference[:, :width])
        assert (reference[:, width:] == pad).all() and not (mine[:, -1] == pad).all()  # no column of padding alone


def test_without_generation_predict_returns_the_trainers_logits(setting, tmp_path):
    """``predict_with_generate=False``: the teacher-forced outputs come back as Seq2SeqTrainer returns them (the
    reference), not cropped as token ids; labels too."""
    import functools

    model, tokenizer, dataset = setting
    outputs = {}
    for cls, arguments in (
        (TransformerTrainer, functools.partial(TransformerTrainingArguments, eval_order="input")),
        (Seq2SeqTrainer, Seq2SeqTrainingArguments),
    ):
        trainer = trainer_of(cls, arguments, setting, tmp_path)
        trainer.args.predict_with_generate = False
        outputs[cls] = trainer.predict(dataset)
    ours, theirs = outputs[TransformerTrainer], outputs[Seq2SeqTrainer]
    for mine, reference in zip(ours.predictions, theirs.predictions):  # logits, the encoder's output
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ours.label_ids, theirs.label_ids)


def test_predict_on_sources_alone_translates_them(setting, tmp_path):
    """A dataset without targets (no ``labels`` column: the collator passes ``labels=None``): the same
    hypotheses as with targets, and no loss."""
    model, tokenizer, dataset = setting
    trainer = trainer_of(TransformerTrainer, TransformerTrainingArguments, setting, tmp_path)
    with_targets = trainer.predict(dataset, num_beams=2, max_new_tokens=6)
    sources_alone = trainer.predict(dataset.remove_columns("labels"), num_beams=2, max_new_tokens=6)
    np.testing.assert_array_equal(sources_alone.predictions, with_targets.predictions)
    assert sources_alone.label_ids is None and "test_loss" not in sources_alone.metrics


def test_predictions_and_labels_come_back_in_the_datasets_order(setting, tmp_path):
    model, tokenizer, dataset = setting
    trainer = trainer_of(TransformerTrainer, TransformerTrainingArguments, setting, tmp_path)
    output = trainer.predict(dataset, num_beams=2, max_new_tokens=6)
    pad = tokenizer.pad_token_id
    for row, (ids, labels) in enumerate(zip(dataset["input_ids"], dataset["labels"])):
        with torch.no_grad():  # the reference: the sentence decoded alone, no padding, no sorting
            alone = model.generate(input_ids=torch.tensor([ids]), num_beams=2, max_new_tokens=6)[0].tolist()
        predicted = [token for token in output.predictions[row].tolist() if token != pad]
        assert predicted == [token for token in alone if token != pad], f"row {row}"
        assert [token for token in output.label_ids[row].tolist() if token not in (-100, pad)] == labels


def test_the_metrics_see_the_predictions_and_labels_in_the_datasets_order(setting, tmp_path):
    """What compute_metrics gets (a metric may index the dataset, e.g. COMET's sources): the plain Trainer's, row
    by row."""
    model, tokenizer, dataset = setting
    seen = []

    def rows(prediction):
        pad = tokenizer.pad_token_id
        seen.append(
            [
                ([t for t in p if t != pad], [t for t in y if t not in (-100, pad)])
                for p, y in zip(prediction.predictions.tolist(), prediction.label_ids.tolist())
            ]
        )
        return {}

    for cls, arguments in (
        (TransformerTrainer, TransformerTrainingArguments),
        (Seq2SeqTrainer, Seq2SeqTrainingArguments),
    ):
        trainer_of(cls, arguments, setting, tmp_path, rows).evaluate(num_beams=1, max_new_tokens=5)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert [labels for _, labels in seen[0]] == dataset["labels"]


def test_the_trainers_order_where_rows_are_not_one_per_sentence(setting, tmp_path, caplog):
    """Several hypotheses a sentence: the Trainer's order; asked for by name (--eval_order length), with a warning
    that says why."""
    import functools
    import logging

    model, tokenizer, dataset = setting
    trainer = trainer_of(TransformerTrainer, TransformerTrainingArguments, setting, tmp_path)
    trainer._gen_kwargs = {"num_return_sequences": 2, "num_beams": 2}
    with caplog.at_level(logging.WARNING):
        assert not isinstance(trainer._get_eval_sampler(dataset), LengthSortedSampler)  # auto: the CPU sorts
    assert not caplog.records
    arguments = functools.partial(TransformerTrainingArguments, eval_order="length")
    named = trainer_of(TransformerTrainer, arguments, setting, tmp_path)
    named._gen_kwargs = {"num_return_sequences": 2, "num_beams": 2}
    with caplog.at_level(logging.WARNING):
        assert not isinstance(named._get_eval_sampler(dataset), LengthSortedSampler)
    assert [r.getMessage() for r in caplog.records] == [
        "--eval_order length: decoding in the dataset's order instead, because of several hypotheses a sentence "
        "(num_return_sequences)"
    ]
    unlabelled = dataset.remove_columns("input_ids")
    assert evaluation_lengths(unlabelled) is None
    assert evaluation_lengths([{"input_ids": [5, 6, 7]}, {"input_ids": [5]}]).tolist() == [3, 1]
    assert evaluation_lengths(dataset.remove_columns("labels")).tolist() == [len(ids) for ids in dataset["input_ids"]]


def test_eval_order_input_keeps_the_trainers_order_and_a_bad_order_is_refused(setting, tmp_path):
    model, tokenizer, dataset = setting
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path), predict_with_generate=True, report_to="none", use_cpu=True, eval_order="input"
    )
    trainer = TransformerTrainer(
        model=model, args=args, processing_class=tokenizer, data_collator=DataCollatorForSeq2Seq(tokenizer, model)
    )
    assert list(trainer._get_eval_sampler(dataset)) == list(range(len(dataset)))
    with pytest.raises(ValueError, match="--eval_order must be one of auto, length, input, got 'longest'"):
        TransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True, eval_order="longest")


def test_the_benchmark_evaluates_both_orders_to_the_same_scores(setting, tmp_path, capsys):
    """benchmarks/evaluation_order.py on a saved model and Multi30k-like files: both orders report the same
    BLEU, chrF and gen_len (the same hypotheses), and a speed for each."""
    import copy
    import gzip

    from helpers import load_script

    benchmark = load_script("benchmarks/evaluation_order.py")
    model, tokenizer, _ = setting
    saved = tmp_path / "model"
    model = copy.deepcopy(model)
    # Every hypothesis of a random model is cut by the length limit: a fixed one (not the batch's longest
    # source + 50) makes them independent of the batches, so both orders must give the same ones.
    model.generation_config.max_new_tokens, model.generation_config.num_beams = 5, 2
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    data = tmp_path / "data"
    data.mkdir()
    for side, texts in (("en", sentences(21, seed=3)), ("de", sentences(21, seed=4))):
        with gzip.open(data / f"val.{side}.gz", "wt", encoding="utf-8") as handle:
            handle.write("\n".join(texts) + "\n")
    result = benchmark.main(
        ["--model", str(saved), "--data-dir", str(data), "--repeats", "1", "--batch-size", "4", "--larger-batch", "8"]
    )
    assert result["sentences"] == 21 and result["num_beams"] == 2
    for key in ("bleu", "chrf", "gen_len"):
        assert result["length"][key] == result["input"][key] == result["length, larger batch"][key], key
    assert result["length"]["loss"] == pytest.approx(result["input"]["loss"], rel=1e-5)
    assert all(result[order]["sentences_per_second"] > 0 for order in ("input", "length"))
    printed = capsys.readouterr().out
    assert "length / input:" in printed and "batch 8 / 4, sorted:" in printed
    assert benchmark.main(["--model", str(saved), "--data-dir", str(tmp_path / "absent")]) is None


def test_a_tokenizer_that_pads_on_the_left_is_refused(setting, tmp_path):
    """The collator pads as the tokenizer says; the encoder's positions count from each row's first column."""
    import copy

    model, tokenizer, _ = setting
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    args = TransformerTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="The tokenizer pads on the left: .*tokenizer.padding_side = 'right'"):
        TransformerTrainer(model=model, args=args, processing_class=left)
