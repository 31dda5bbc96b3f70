"""training/translate.py (vanilla_transformer.training.translation): batched beam search in input
order, paper defaults, blank and over-long lines, dtype, scoring, pictures."""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import translation as translate

SENTENCES = [
    "a long sentence with many words in it to make it the longest",
    "short",
    "a medium sentence here",
    "x",
    "another medium one",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("model"))


def save_model(folder: Path, **overrides) -> Path:
    tokenizer = vanilla_transformer.train_tokenizer(iter(SENTENCES * 3), vocab_size=300)
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        **overrides,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config.max_new_tokens = 8  # an untrained model never stops by itself
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(model_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def one_by_one(model, tokenizer, sentences):
    outputs = []
    for sentence in sentences:
        with torch.no_grad():
            generated = model.generate(**tokenizer([sentence], return_tensors="pt"))
        outputs.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return outputs


def test_batched_hypotheses_come_back_in_input_order(loaded):
    model, tokenizer = loaded
    assert translate.translate(model, tokenizer, SENTENCES, batch_size=2) == one_by_one(model, tokenizer, SENTENCES)


def test_command_line_reads_a_file_and_writes_hypotheses_in_order(model_dir, loaded, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    output = tmp_path / "out.txt"
    translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(output), "--batch-size", "2"])
    assert output.read_text().splitlines() == one_by_one(*loaded, SENTENCES)


def test_a_line_break_inside_a_hypothesis_keeps_the_output_aligned_and_is_named(
    model_dir, tmp_path, monkeypatch, caplog
):
    """The byte-level vocabulary has a piece for a line break; written as it is, it would shift every later
    line of --output against its source. Each becomes a space, and the lines are named."""
    hypotheses = ["a\nb", "c", "d\r\ne\rf", "\u2028g"]  # a line separator other than \r and \n is kept
    monkeypatch.setattr(translate, "translate", lambda model, tokenizer, sources, *a, **k: hypotheses[: len(sources)])
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("one\ntwo\nthree\nfour\n")
    with caplog.at_level(logging.WARNING):
        translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(output)])
    assert output.read_text(encoding="utf-8").split("\n") == ["a b", "c", "d e f", "\u2028g", ""]
    assert f"--output {output}: 2 hypotheses held a line break" in caplog.text and "(line 1, 3)" in caplog.text
    # scored as written: sacreBLEU's 13a joins "Hund-\nrennt" into one word, the file holds "Hund- rennt"
    hypotheses[:] = ["Der Hund-\nrennt schnell heute", "c", "d", "g"]
    references = tmp_path / "ref.txt"
    references.write_text("Der Hund- rennt schnell heute\nc\nd\ng\n")
    result = translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(output),
                             "--references", str(references)])  # fmt: skip
    written, expected = output.read_text(encoding="utf-8").splitlines(), references.read_text().splitlines()
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(written, [expected]).score) == pytest.approx(100)


def test_stdin_to_stdout(model_dir, loaded, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"short\nx\n")))  # bytes underneath, as a real stdin
    translate.main(["--model", str(model_dir)])
    assert capsys.readouterr().out.splitlines() == one_by_one(*loaded, ["short", "x"])


def test_scores_equal_sacrebleu_on_the_written_hypotheses(model_dir, tmp_path):
    source, references = tmp_path / "in.txt", tmp_path / "ref.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    references.write_text("".join(s.upper() + "\n" for s in SENTENCES))
    output, metrics = tmp_path / "out.txt", tmp_path / "m.json"
    result = translate.main(
        [
            "--model",
            str(model_dir),
            "--input",
            str(source),
            "--output",
            str(output),
            "--references",
            str(references),
            "--metrics-json",
            str(metrics),
        ]
    )
    hypotheses = output.read_text().splitlines()
    reference_lines = references.read_text().splitlines()
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [reference_lines]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [reference_lines]).score)
    assert result["bleu_signature"].startswith("nrefs:1|") and json.loads(metrics.read_text())["sentences"] == 5


def test_paper_decoding_defaults_come_from_the_generation_config(loaded):
    model, _ = loaded
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6


def test_the_length_penalty_flags_reach_generate(model_dir, tmp_path, monkeypatch, capsys):
    """--length-penalty and --length-penalty-formula reach translate() (and so generate()) as those settings,
    absent ones stay absent (the model's generation config decides); a formula that does not exist and a
    penalty that is not a number are refused by name."""
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    calls = []

    def spy(model, tokenizer, sentences, batch_size, **kwargs):
        calls.append({key: kwargs[key] for key in kwargs if key in ("length_penalty", "length_penalty_formula")})
        return ["x"] * len(sentences)

    monkeypatch.setattr(translate, "translate", spy)
    base = ["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "out"), "--no-progress"]
    translate.main(base + ["--length-penalty", "2.0", "--length-penalty-formula", "length"])
    translate.main(base)
    assert calls == [{"length_penalty": 2.0, "length_penalty_formula": "length"}, {}]
    with pytest.raises(SystemExit):
        translate.parse_args(["--model", str(model_dir), "--length-penalty-formula", "wu"])
    assert "--length-penalty-formula: invalid choice: 'wu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        translate.parse_args(["--model", str(model_dir), "--length-penalty", "nan"])
    assert "--length-penalty must be a finite number" in capsys.readouterr().err


@pytest.mark.parametrize("eos_logit", [-1e9, 1e9])
def test_translations_cut_off_by_the_length_limit_are_named_in_a_warning(loaded, eos_logit, caplog):
    """A loop must not pass silently. With </s> impossible every decoded line runs to the limit and
    is named by its line (blank lines are not decoded); with </s> certain none is."""
    model, tokenizer = loaded
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([3]), eos_logit))
    try:
        with caplog.at_level(logging.WARNING, logger=translate.__name__):
            translate.translate(
                model, tokenizer, ["a medium sentence here", "", "x", "short"], lines_of="--input in.txt"
            )
    finally:
        handle.remove()
    if eos_logit < 0:
        assert "3 of 3 translation(s) reached the length limit without </s>" in caplog.text
        assert "--input in.txt, line 1, 3, 4. Long inputs may need a longer limit (max_new_tokens);" in caplog.text
    else:
        assert "length limit" not in caplog.text


def test_misaligned_references_are_an_error(model_dir, tmp_path):
    source, references = tmp_path / "in.txt", tmp_path / "ref.txt"
    source.write_text("a\nb\nc\n")
    references.write_text("a\nb\n")
    with pytest.raises(ValueError, match="3 lines but --references has 2"):
        translate.main(["--model", str(model_dir), "--input", str(source), "--references", str(references)])


def test_several_hypotheses_a_sentence_are_refused_before_decoding(loaded, monkeypatch):
    """translate gives one translation a sentence: num_return_sequences > 1 (in the call, or in the model's
    generation config as a --generation_config file may set it) would pair sentences with others' hypotheses."""
    model, tokenizer = loaded
    monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(ValueError, match=r"^translate gives one translation a sentence; num_return_sequences=2"):
        translate.translate(model, tokenizer, ["a b", "c"], num_beams=2, num_return_sequences=2)
    monkeypatch.setattr(model.generation_config, "num_return_sequences", 3)
    with pytest.raises(ValueError, match=r"num_return_sequences=3 \(from the call or the model's"):
        translate.translate(model, tokenizer, ["a b", "c"])


def test_bad_batch_size_is_an_error(loaded):
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        translate.translate(*loaded, SENTENCES, batch_size=0)


def test_one_string_a_non_string_or_another_models_tokenizer_is_refused_before_decoding(loaded, monkeypatch):
    """translate("A dog runs.") gave one "translation" per character; None among the sentences an AttributeError,
    and a tokenizer of more tokens than the model's vocabulary an IndexError from inside the embedding."""
    model, tokenizer = loaded
    monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(TypeError, match=r"got one string, which it would translate character by character"):
        translate.translate(model, tokenizer, "a b c")
    with pytest.raises(TypeError, match=r"sentence 2 \(1-based\) is a NoneType, not a string"):
        translate.translate(model, tokenizer, ["a b", None])
    larger = vanilla_transformer.train_tokenizer(iter(SENTENCES * 3 + ["zebra quagga okapi"] * 5), vocab_size=400)
    assert len(larger) > model.config.vocab_size
    with pytest.raises(ValueError, match="The tokenizer does not match the model: the tokenizer has"):
        translate.translate(model, larger, ["a b"])


def test_attention_pictures_for_the_first_inputs(model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    result = translate.main(
        [
            "--model",
            str(model_dir),
            "--input",
            str(source),
            "--output",
            str(tmp_path / "o"),
            "--attention-png",
            str(tmp_path / "pictures"),
            "--attention-count",
            "2",
            "--num-beams",
            "1",
        ]
    )
    hypotheses = (tmp_path / "o").read_text().splitlines()
    drawn = [f"{i:04d}" for i in range(2) if hypotheses[i].strip()]
    folders = sorted(p.name for p in (tmp_path / "pictures").iterdir()) if (tmp_path / "pictures").exists() else []
    assert folders == drawn
    assert result["attention_skipped"] == [i for i in range(2) if not hypotheses[i].strip()]
    assert all(Path(p).stat().st_size > 0 for p in result["attention_pictures"])
    assert all(Path(p).read_bytes().startswith(b"\x89PNG") for p in result["attention_pictures"])


def test_an_empty_translation_gets_no_pictures_and_is_named_on_stderr(loaded, tmp_path, capsys):
    model, tokenizer = loaded
    args = argparse.Namespace(attention_png=str(tmp_path / "pictures"), attention_count=3)
    paths, skipped = translate.write_pictures(model, tokenizer, SENTENCES[:3], ["", SENTENCES[1], " "], args)
    assert skipped == [0, 2]
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == ["0001"]
    assert paths and all(Path(p).read_bytes().startswith(b"\x89PNG") for p in paths)
    assert "line(s) 1, 3 of the input: their translation is empty" in capsys.readouterr().err


def test_an_input_too_long_for_the_model_gets_no_picture_and_is_named(short_model_dir, tmp_path, capsys):
    """--truncate or --skip-long translated it; its picture would need the whole source, which the model cannot
    read: it once failed after the translations were written, and --metrics-json was lost."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(short_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(short_model_dir)
    long_line = " ".join(["medium sentence"] * 10)
    args = argparse.Namespace(attention_png=str(tmp_path / "pictures"), attention_count=3)
    paths, skipped = translate.write_pictures(model, tokenizer, [long_line, "short", long_line], ["x y", "x", ""], args)
    assert skipped == [0, 2] and sorted(p.name for p in (tmp_path / "pictures").iterdir()) == ["0001"]
    error = capsys.readouterr().err  # --skip-long left the third one untranslated: too long, not "empty"
    assert "line(s) 1, 3 of the input: longer than the 12 tokens" in error and "empty" not in error


def test_sources_and_references_both_from_stdin_are_refused(model_dir):
    """They once read the sources, then 0 references, and blamed the line counts."""
    with pytest.raises(ValueError, match="--input - and --references - would both read standard input"):
        translate.main(["--model", str(model_dir), "--input", "-", "--references", "-"])


def test_a_generator_of_sentences_is_translated_as_the_list_of_them(loaded):
    """The type check once read a generator to its end, and nothing was left to translate: []."""
    model, tokenizer = loaded
    expected = translate.translate(model, tokenizer, SENTENCES[:3], num_beams=1)
    assert translate.translate(model, tokenizer, (s for s in SENTENCES[:3]), num_beams=1) == expected
    assert len(expected) == 3


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has an MPS device")
def test_a_device_this_machine_lacks_is_refused_naming_the_flag_before_the_model_loads(
    model_dir, tmp_path, monkeypatch
):
    """--device mps on a machine without one failed with torch's traceback after the model was loaded."""
    source = tmp_path / "in.txt"
    source.write_text("short\n")
    monkeypatch.setattr(translate, "read_input", lambda *a: pytest.fail("read the input before refusing"))
    with pytest.raises(ValueError, match=r"--device mps: not available here \(.*\); use --device cpu"):
        translate.main(["--model", str(model_dir), "--input", str(source), "--device", "mps"])


def test_an_existing_writable_output_in_a_folder_one_cannot_write_is_accepted(tmp_path, monkeypatch):
    """/dev/null for a timing run, a file set up for the job in a read-only folder: the folder's permission
    was asked, not the file's. Permissions as a non-root user has them (root may write anywhere)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    (folder / "given.txt").write_text("")
    monkeypatch.setattr(translate.os, "access", lambda path, mode: Path(path) != folder)
    translate._check_writable("--output", folder / "given.txt", set())
    with pytest.raises(PermissionError, match="--output .*new.txt cannot be written"):
        translate._check_writable("--output", folder / "new.txt", set())


def test_a_device_torch_does_not_know_is_refused_naming_the_flag(model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("short\n")
    with pytest.raises(ValueError, match="--device bogus: not a device"):
        translate.main(["--model", str(model_dir), "--input", str(source), "--device", "bogus"])


def test_metrics_json_dash_writes_to_stdout_when_the_translations_go_to_a_file(model_dir, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("short\n")
    translate.main(
        ["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o"), "--metrics-json", "-"]
    )
    assert json.loads(capsys.readouterr().out)["sentences"] == 1 and not (tmp_path / "-").exists()
    with pytest.raises(ValueError, match="would both write to stdout"):
        translate.main(["--model", str(model_dir), "--input", str(source), "--metrics-json", "-"])


# ---------------------------------------------------------------------------------------------
# Blank lines, lines longer than the model accepts, dtype, progress
# ---------------------------------------------------------------------------------------------


def test_blank_lines_give_blank_outputs_and_are_not_decoded(loaded, model_dir, tmp_path):
    model, tokenizer = loaded
    lines = ["short", "", "   ", "x", "\t"]
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in lines))
    translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(output)])
    assert output.read_text().split("\n")[:-1] == [
        one_by_one(model, tokenizer, ["short"])[0],
        "",
        "",
        one_by_one(model, tokenizer, ["x"])[0],
        "",
    ]


def test_an_input_of_blank_lines_only_gives_as_many_blank_lines(model_dir, tmp_path):
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n  \n\n")
    translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(output)])
    assert output.read_text() == "\n\n\n"


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("short"), max_position_embeddings=12)


def test_a_line_too_long_fails_before_decoding_and_is_named(short_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(short_model_dir)
    long_line = " ".join(["medium sentence"] * 10)
    assert len(tokenizer(long_line)["input_ids"]) > 12
    source = tmp_path / "in.txt"
    source.write_text(f"short\n{long_line}\nx\n")
    decoded = []
    monkeypatch.setattr(
        VanillaTransformerForConditionalGeneration, "generate", lambda self, **kwargs: decoded.append(1)
    )
    with pytest.raises(
        ValueError,
        match=r"longer than the 12 tokens the model accepts: --input .*in.txt, line 2 \(\d+ tokens\)\. .*"
        r"skip or truncate them \(--skip-long or --truncate\)\.$",
    ):
        translate.main(["--model", str(short_model_dir), "--input", str(source), "--output", str(tmp_path / "o")])
    assert decoded == [] and not (tmp_path / "o").exists()
    model = AutoModelForSeq2SeqLM.from_pretrained(short_model_dir)
    with pytest.raises(ValueError, match=r"skip or truncate them \(long_inputs=\"skip\" or \"truncate\"\)\.$"):
        translate.translate(model, tokenizer, ["short", long_line])  # from Python: the argument, not a flag


def test_skip_long_leaves_the_line_empty_and_truncate_translates_its_start(short_model_dir, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tokenizer = (
        AutoModelForSeq2SeqLM.from_pretrained(short_model_dir),
        AutoTokenizer.from_pretrained(short_model_dir),
    )
    model.generation_config.max_new_tokens = 5
    long_line = " ".join(["medium sentence"] * 10)
    lines = ["short", long_line, "x"]
    skipped = translate.translate(model, tokenizer, lines, long_inputs="skip")
    assert skipped == [one_by_one(model, tokenizer, ["short"])[0], "", one_by_one(model, tokenizer, ["x"])[0]]
    truncated = translate.translate(model, tokenizer, lines, long_inputs="truncate")
    ids = tokenizer(long_line)["input_ids"][:11] + [tokenizer.eos_token_id]  # the limit, </s> kept
    with torch.no_grad():
        expected = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, 12, dtype=torch.long))
    assert truncated[1] == tokenizer.decode(expected[0], skip_special_tokens=True)
    assert truncated[0] == skipped[0] and truncated[2] == skipped[2]


def test_dtype_and_device_flags_decode_as_a_model_loaded_in_that_dtype(model_dir, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    translate.main(
        [
            "--model",
            str(model_dir),
            "--input",
            str(source),
            "--output",
            str(output),
            "--dtype",
            "bfloat16",
            "--device",
            "cpu",
            "--batch-size",
            "1",
        ]
    )
    assert output.read_text().splitlines() == one_by_one(model, tokenizer, SENTENCES)


def test_progress_bar_on_stderr_unless_switched_off(model_dir, tmp_path, capsys, monkeypatch):
    from transformers.utils import logging as transformers_logging

    if not transformers_logging.is_progress_bar_enabled():  # HF_HUB_DISABLE_PROGRESS_BARS=1, as CI often sets
        monkeypatch.setattr(transformers_logging, "_tqdm_active", True)  # on for this test, put back after it
    source = tmp_path / "in.txt"
    source.write_text("short\nx\n")
    translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o")])
    shown = capsys.readouterr().err
    assert "translating" in shown and "Loading weights" in shown  # ours, and transformers' own
    translate.main(
        ["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o"), "--no-progress"]
    )
    hidden = capsys.readouterr().err
    assert "translating" not in hidden and "Loading weights" not in hidden
    assert transformers_logging.is_progress_bar_enabled()  # as it was, for whatever runs next


def test_an_output_ending_in_gz_is_written_compressed(model_dir, loaded, tmp_path):
    """Every reader here takes .gz files by their content; a .gz output that held plain text would be
    refused by ``gunzip`` and by tools that go by the name."""
    import gzip

    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    translate.main(["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o.gz")])
    with gzip.open(tmp_path / "o.gz", "rt", encoding="utf-8") as file:
        assert file.read().splitlines() == one_by_one(*loaded, SENTENCES)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--num-beams", "-1"], "--num-beams must be positive"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    ],
)
def test_numeric_flags_out_of_range_are_refused(model_dir, argv, message, capsys):
    with pytest.raises(SystemExit):
        translate.parse_args(["--model", str(model_dir), *argv])
    assert message in capsys.readouterr().err


def test_an_empty_input_file_is_an_error(model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_bytes(b"")
    with pytest.raises(ValueError, match="--input .*is empty"):
        translate.main(["--model", str(model_dir), "--input", str(source)])


def test_the_static_cache_translates_alike_in_few_batch_shapes(model_dir, loaded, tmp_path, monkeypatch):
    """--static-cache: generate() with a static cache (compiled on CUDA, one graph per batch shape), each batch's
    sources padded to a multiple of 16 tokens so that the shapes are few. The reference: each sentence decoded
    alone with the default cache."""
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES))
    expected = one_by_one(*loaded, SENTENCES)
    calls = []
    generate = VanillaTransformerForConditionalGeneration.generate

    def recorded(self, *args, **kwargs):
        calls.append((tuple(kwargs["input_ids"].shape), kwargs.get("cache_implementation")))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(VanillaTransformerForConditionalGeneration, "generate", recorded)
    allowed = []  # torch.compile's limit of graphs (8), raised to the batch shapes planned
    monkeypatch.setattr(translate, "allow_recompiles", allowed.append)
    output = tmp_path / "out.txt"
    argv = ["--model", str(model_dir), "--input", str(source), "--output", str(output), "--batch-size", "2"]
    translate.main([*argv, "--static-cache"])
    assert output.read_text().splitlines() == expected
    assert len(calls) == 3 and all(cache == "static" and width % 16 == 0 for (_, width), cache in calls), calls
    assert allowed == [len(set(calls))]
    calls.clear()
    translate.main(argv)  # without it: the default cache, each batch as wide as its longest source
    assert all(cache is None for _, cache in calls) and any(width % 16 for (_, width), _ in calls), calls


def test_padding_to_a_multiple_stops_at_the_models_positions(short_model_dir):
    """A source of 12 tokens for a model of 12 positions stays 12 wide: a multiple of 16 would need positions the
    model does not have."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(short_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(short_model_dir)
    model.generation_config.max_new_tokens = 5
    long_line = " ".join(["medium sentence"] * 10)
    lines = ["short", long_line, "x"]
    expected = translate.translate(model, tokenizer, lines, long_inputs="truncate")
    padded = translate.translate(model, tokenizer, lines, long_inputs="truncate", pad_to_multiple_of=16)
    assert padded == expected
    batch = tokenizer(["short"], return_tensors="pt")
    widened = translate.padded_to_multiple(batch, 16, 12, tokenizer.pad_token_id)
    width, length = widened["input_ids"].shape[1], int(batch["attention_mask"][0].sum())
    assert width == 12 and widened["attention_mask"][0].tolist() == [1] * length + [0] * (12 - length)


def test_translating_a_checkpoint_of_a_moving_average_run_says_which_weights_it_loads(model_dir, tmp_path, caplog):
    """A checkpoint of an --ema_decay run holds the trained weights and, beside them, their moving average: loading
    it takes the trained ones, which the user who meant the average would never learn."""
    import shutil

    checkpoint = tmp_path / "run" / "checkpoint-5"
    shutil.copytree(model_dir, checkpoint)
    source = tmp_path / "in.txt"
    source.write_text("short\n")
    argv = ["--model", str(checkpoint), "--input", str(source), "--output", str(tmp_path / "out.txt")]
    with caplog.at_level(logging.WARNING):
        translate.main(argv)
    assert "moving average" not in caplog.text  # a checkpoint without one
    shutil.copy(checkpoint / "model.safetensors", checkpoint / "ema.safetensors")
    with caplog.at_level(logging.WARNING):
        translate.main(argv)
    assert f"--model {checkpoint}: a checkpoint of a run with --ema_decay; its trained weights" in caplog.text
    assert f"the run's final model in {checkpoint.parent} holds" in caplog.text
