"""Specification of the tokenizer: joint byte-level BPE, fixed special ids, exact round trips.

References are independent of the code under test: `unicodedata.normalize("NFKC", ...)` for round
trips, `VanillaTransformerConfig()` for special ids, the plain `tokenizers` library reading the saved
`tokenizer.json`, and a fresh process without the package for remote code.
"""

import gzip
import json
import os
import random
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from helpers import run_without_package
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerTokenizer, train_tokenizer
from vanilla_transformer.tokenization_vanilla_transformer import MIN_VOCAB_SIZE, main

REPO = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("VT_SHARED_DIR", REPO.parent / "shared"))
VOCAB_SIZE = 400

# Text the tokenizer never saw in training: other scripts, emoji, odd whitespace, literal special tokens.
UNSEEN_SAMPLES = [
    "Zwei Männer überqueren die Straße.",
    "Un garçon à côté d'une fenêtre, très élégant ; où ça ?",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "两个男人在街上走。日本語のテキスト、한국어 문장.",
    "Emoji: 🤖 👍🏽 👩‍👩‍👧 🇩🇪",
    "repeated   spaces    here",
    "   leading and trailing spaces   ",
    "tab\tinside\tand\nnewline\r\ninside",
    "an HTML <s>struck</s> tag and <pad> <unk> as text",
    "ﬁne full-width ＡＢＣ１２３ and ellipsis … compatibility forms",
    "Hello , world . do n't say ' quoted ' !",
    "",
    " ",
]


def _generated_corpus(seed: int = 0, size: int = 400) -> list[str]:
    """Small English and German sentences, ASCII plus German umlauts only."""
    rng = random.Random(seed)
    subjects = ["A man", "Two women", "The dog", "Ein Mann", "Zwei Frauen", "Der Hund", "A child", "Ein Kind"]
    verbs = ["walks", "runs", "sits", "läuft", "geht", "sitzt", "plays", "spielt"]
    places = ["on the street.", "in the park.", "auf der Straße.", "im Park.", "near the water.", "am Wasser."]
    return [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(places)}" for _ in range(size)]


CORPUS = _generated_corpus()


@pytest.fixture(scope="module")
def tokenizer() -> VanillaTransformerTokenizer:
    return train_tokenizer(CORPUS, vocab_size=VOCAB_SIZE, min_frequency=2)


@pytest.fixture(scope="module")
def saved_dir(tokenizer, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(directory)
    return directory


def _write_lines(path: Path, lines: list[str]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as file:
        file.write("".join(line + "\n" for line in lines))
    return path


def _model_json(tokenizer) -> dict:
    """The trained vocabulary and merges, as tokenizers serialises them."""
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]


# Special tokens and the model config


def test_special_token_ids_equal_config_defaults(tokenizer):
    config = VanillaTransformerConfig()
    assert tokenizer.pad_token_id == config.pad_token_id == 0
    assert tokenizer.bos_token_id == config.bos_token_id == config.decoder_start_token_id == 2
    assert tokenizer.eos_token_id == config.eos_token_id == 3
    assert tokenizer.unk_token_id == 1
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]


def test_vocabulary_is_no_larger_than_asked(tokenizer):
    assert MIN_VOCAB_SIZE <= len(tokenizer) <= VOCAB_SIZE


# Encoding: </s> after every sequence, no <s>, right padding, no truncation


def test_every_sequence_ends_with_eos_and_none_starts_with_bos(tokenizer):
    batch = tokenizer(["A man walks.", "Zwei Frauen", ""]).input_ids
    for ids in batch:
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.bos_token_id not in ids
    assert batch[2] == [tokenizer.eos_token_id]


def test_labels_are_the_target_encoded_alone_ending_with_eos(tokenizer):
    encoded = tokenizer(["A man walks."], text_target=["Ein Mann geht."])
    assert encoded["labels"][0] == tokenizer("Ein Mann geht.").input_ids
    assert encoded["labels"][0][-1] == tokenizer.eos_token_id
    assert set(encoded) == {"input_ids", "attention_mask", "labels"}


def test_padding_is_on_the_right_with_pad_id(tokenizer):
    short, long = tokenizer(["A dog", "A man walks in the park."]).input_ids
    padded = tokenizer(["A dog", "A man walks in the park."], padding=True)
    assert padded.input_ids[0] == short + [0] * (len(long) - len(short))
    assert padded.attention_mask[0] == [1] * len(short) + [0] * (len(long) - len(short))


def test_collator_pads_labels_with_minus_100(tokenizer):
    sources, targets = ["A dog", "A man walks in the park."], ["Ein Hund", "Ein Mann läuft im Park auf der Straße."]
    features = [tokenizer(s, text_target=t) for s, t in zip(sources, targets)]
    batch = DataCollatorForSeq2Seq(tokenizer)(features)
    width = max(len(f["labels"]) for f in features)
    expected = [f["labels"] + [-100] * (width - len(f["labels"])) for f in features]
    assert batch["labels"].tolist() == expected
    assert batch["input_ids"][0].tolist()[-1] == tokenizer.pad_token_id


def test_long_text_is_not_truncated(tokenizer):
    text = " ".join(CORPUS * 5)  # tens of thousands of characters
    ids = tokenizer(text).input_ids
    assert len(ids) > 5000
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


# Round trips, and no <unk> for any character


@pytest.mark.parametrize("text", UNSEEN_SAMPLES)
def test_decode_inverts_encode_up_to_nfkc(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFKC", text)


def test_batch_decode_inverts_batch_encode(tokenizer):
    decoded = tokenizer.batch_decode(tokenizer(UNSEEN_SAMPLES).input_ids, skip_special_tokens=True)
    assert decoded == [unicodedata.normalize("NFKC", text) for text in UNSEEN_SAMPLES]


def test_random_code_points_from_every_plane_never_give_unk(tokenizer):
    rng = random.Random(0)
    surrogates = range(0xD800, 0xE000)  # not encodable as UTF-8
    code_points = [c for c in (rng.randrange(0x110000) for _ in range(3000)) if c not in surrogates]
    text = "".join(map(chr, code_points))
    ids = tokenizer(text).input_ids
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFKC", text)


def test_decode_does_not_clean_up_spaces(tokenizer):
    text = "Hello , world . do n't say ' quoted ' !"
    assert tokenizer.clean_up_tokenization_spaces is False
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_written_special_tokens_are_text(tokenizer):
    ids = tokenizer("<s> </s> <pad>").input_ids
    assert ids[:-1] and not set(ids[:-1]) & {0, 1, 2, 3}


# Saving and loading


def test_save_pretrained_writes_tokenizer_files_and_remote_code(saved_dir):
    assert {"tokenizer.json", "tokenizer_config.json", "tokenization_vanilla_transformer.py"} <= {
        path.name for path in saved_dir.iterdir()
    }
    config = json.loads((saved_dir / "tokenizer_config.json").read_text())
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_vanilla_transformer.VanillaTransformerTokenizer"
    assert config["model_max_length"] == 1024  # the presets' max_position_embeddings: truncation=True works


def test_auto_tokenizer_reloads_same_class_and_ids(tokenizer, saved_dir):
    reloaded = AutoTokenizer.from_pretrained(saved_dir)
    assert type(reloaded) is VanillaTransformerTokenizer
    assert reloaded(UNSEEN_SAMPLES).input_ids == tokenizer(UNSEEN_SAMPLES).input_ids
    assert reloaded.all_special_ids == tokenizer.all_special_ids
    assert reloaded.padding_side == "right"
    assert reloaded.clean_up_tokenization_spaces is False


def test_plain_tokenizers_library_reads_tokenizer_json_the_same(tokenizer, saved_dir):
    backend = Tokenizer.from_file(str(saved_dir / "tokenizer.json"))
    # split_special_tokens lives in tokenizer_config.json; tokenizer.json users set it themselves.
    backend.encode_special_tokens = True
    assert [e.ids for e in backend.encode_batch(UNSEEN_SAMPLES)] == tokenizer(UNSEEN_SAMPLES).input_ids


def test_remote_code_loads_without_the_package(tokenizer, saved_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))  # keep ~/.cache clean
    code = f"""
        import json
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(saved_dir)!r}, trust_remote_code=True)
        print(json.dumps([type(tokenizer).__name__, tokenizer({UNSEEN_SAMPLES!r}).input_ids]))
    """
    class_name, ids = json.loads(run_without_package(code, cwd=tmp_path).strip().splitlines()[-1])
    assert class_name == "VanillaTransformerTokenizer"
    assert ids == tokenizer(UNSEEN_SAMPLES).input_ids


# Training inputs: texts, files, gzip, determinism


def test_training_is_deterministic():
    first = train_tokenizer(CORPUS, vocab_size=VOCAB_SIZE)
    second = train_tokenizer(CORPUS, vocab_size=VOCAB_SIZE)
    assert _model_json(first) == _model_json(second)
    assert first(UNSEEN_SAMPLES).input_ids == second(UNSEEN_SAMPLES).input_ids


def test_files_texts_and_generators_give_the_same_vocabulary(tmp_path, tokenizer):
    half = len(CORPUS) // 2
    source = _write_lines(tmp_path / "train.en", CORPUS[:half])
    target = _write_lines(tmp_path / "train.de", CORPUS[half:])
    reference = _model_json(tokenizer)
    assert _model_json(train_tokenizer([source, target], vocab_size=VOCAB_SIZE)) == reference
    assert _model_json(train_tokenizer([str(source), str(target)], vocab_size=VOCAB_SIZE)) == reference
    assert _model_json(train_tokenizer(iter(CORPUS), vocab_size=VOCAB_SIZE)) == reference


def test_gzip_file_gives_the_same_vocabulary_as_plain(tmp_path):
    plain = _write_lines(tmp_path / "corpus.txt", CORPUS)
    compressed = _write_lines(tmp_path / "corpus.txt.gz", CORPUS)
    assert compressed.read_bytes()[:2] == b"\x1f\x8b"
    assert _model_json(train_tokenizer([compressed], vocab_size=VOCAB_SIZE)) == _model_json(
        train_tokenizer([plain], vocab_size=VOCAB_SIZE)
    )


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_pipe_gives_the_same_vocabulary_as_its_file(tmp_path, compressed):
    """``vanilla-transformer tokenizer <(zcat train.en.gz)``: a pipe can be read once; telling gzip from plain
    text once took its first 8 KiB away (the 400 first lines of a big file, a small file whole)."""
    import threading

    source = _write_lines(tmp_path / ("corpus.txt.gz" if compressed else "corpus.txt"), CORPUS)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()

    def write():
        try:
            fifo.write_bytes(source.read_bytes())
        except BrokenPipeError:  # the reader closed the pipe early
            pass
        while not done.wait(0.1):  # a reader that opens the pipe again gets an end of file, not a wait forever
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader now
                pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        piped = train_tokenizer([fifo], vocab_size=VOCAB_SIZE)
    finally:
        done.set()
        writer.join()
    assert _model_json(piped) == _model_json(train_tokenizer([source], vocab_size=VOCAB_SIZE))


# Bad input: a clear error that says what is wrong


@pytest.mark.parametrize("empty", [[], (), iter([]), ["", "  ", "\t"]], ids=["list", "tuple", "iterator", "blank"])
def test_no_text_is_an_error(empty):
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer(empty, vocab_size=VOCAB_SIZE)


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer([_write_lines(tmp_path / "empty.txt", [])], vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize("items", [["a man", 3], iter(["a man", b"bytes"])], ids=["list", "iterator"])
def test_non_string_item_names_index_and_type(items):
    with pytest.raises(TypeError, match=r"item 1 .*(int|bytes)"):
        train_tokenizer(items, vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize("value", ["A man walks.", b"text", 42])
def test_a_single_string_or_non_iterable_is_an_error(value):
    with pytest.raises(TypeError, match="texts_or_files"):
        train_tokenizer(value, vocab_size=VOCAB_SIZE)


def test_vocab_size_below_alphabet_plus_specials_says_the_minimum():
    assert MIN_VOCAB_SIZE == 256 + 4
    with pytest.raises(ValueError, match=r"vocab_size >= 260"):
        train_tokenizer(CORPUS, vocab_size=259)
    train_tokenizer(CORPUS, vocab_size=260)


@pytest.mark.parametrize("kwargs", [dict(vocab_size=300.0), dict(min_frequency="2")])
def test_sizes_must_be_integers(kwargs):
    with pytest.raises(TypeError, match="must be an int"):
        train_tokenizer(CORPUS, **kwargs)


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match="missing.txt.*item 0"):
        train_tokenizer([missing], vocab_size=VOCAB_SIZE)
    existing = _write_lines(tmp_path / "train.en", CORPUS)
    with pytest.raises(FileNotFoundError, match="missing.txt.*item 1"):
        train_tokenizer([str(existing), str(missing)], vocab_size=VOCAB_SIZE)


def test_every_path_mistyped_is_named_not_trained_on_as_text(tmp_path, monkeypatch):
    """train_tokenizer(["trian.en.gz", "trian.de.gz"]) (model.md's form, both mistyped) trained on the two file
    names as sentences: a vocabulary of bytes, and only a warning that it had few merges. Sentences pass, and
    path-like strings given as an iterator are text, as documented."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"looks like a list of file paths.*'trian.en.gz' \(item 0\)"):
        train_tokenizer(["trian.en.gz", "data/trian.de.gz"], vocab_size=VOCAB_SIZE)
    for names in (["data/trian.src", "data/trian.tgt"], ["train.tok", "news.en.sgm"], ["C:\\data\\a.en"]):
        with pytest.raises(FileNotFoundError, match="looks like a list of file paths"):
            train_tokenizer(names, vocab_size=VOCAB_SIZE)
    assert len(train_tokenizer(["train.en.gz", "A dog runs."] * 20, vocab_size=VOCAB_SIZE)) > 0  # a sentence
    for texts in (["www.example.com", "john@doe.org", "np.sum"], ["and/or", "1/2", "https://a.b/c.txt"]):
        assert len(train_tokenizer(texts * 20, vocab_size=VOCAB_SIZE)) > 0  # text that is no file's name
    assert len(train_tokenizer(iter(["trian.en.gz", "trian.de.gz"] * 20), vocab_size=VOCAB_SIZE)) > 0


def test_a_folder_without_tokenizer_json_is_named_as_such(saved_dir, tmp_path):
    """transformers blamed a missing sentencepiece or tiktoken for a folder whose tokenizer.json was not copied."""
    import shutil

    from transformers import AutoTokenizer

    copy = shutil.copytree(saved_dir, tmp_path / "copy")
    (copy / "tokenizer.json").unlink()
    with pytest.raises(OSError, match=f"{copy} has no tokenizer.json, which holds this tokenizer's whole vocabulary"):
        AutoTokenizer.from_pretrained(copy)
    with pytest.raises(OSError, match=f"{copy} has no tokenizer.json"):  # (None: no file given elsewhere)
        AutoTokenizer.from_pretrained(copy, tokenizer_file=None)
    elsewhere = AutoTokenizer.from_pretrained(copy, tokenizer_file=str(saved_dir / "tokenizer.json"))
    assert elsewhere("a b").input_ids == AutoTokenizer.from_pretrained(saved_dir)("a b").input_ids


def test_directory_given_as_file_is_an_error(tmp_path):
    existing = _write_lines(tmp_path / "train.en", CORPUS)
    for directory in (tmp_path, str(tmp_path)):
        with pytest.raises(IsADirectoryError, match="is a directory"):
            train_tokenizer([existing, directory], vocab_size=VOCAB_SIZE)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_an_error(tmp_path):
    unreadable = _write_lines(tmp_path / "secret.txt", CORPUS)
    unreadable.chmod(0)
    with pytest.raises(PermissionError, match="not readable"):
        train_tokenizer([unreadable], vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"fine\nfine too\n\xff\xfe not utf-8\n", r"training file '.*bad.txt', line 3: not valid UTF-8"),
        (b"\x1f\x8b truncated gzip", r"cannot read training file '.*bad.txt'"),
    ],
    ids=["latin", "gzip"],
)
def test_undecodable_file_is_an_error(tmp_path, content, message):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        train_tokenizer([bad], vocab_size=VOCAB_SIZE)


def test_files_are_read_by_the_training_datas_rules(tmp_path, monkeypatch):
    """The tokenizer sees the lines train's data sees: the byte-order mark and each line's "\\r\\n" dropped, a lone
    "\\r" inside a line kept (the data reader's rules, `numbered_lines`)."""
    from vanilla_transformer import tokenization_vanilla_transformer as module
    from vanilla_transformer.training.data import read_lines

    path = tmp_path / "windows.txt"
    path.write_bytes("\ufeffhello world\r\nsecond\rline\r\nlast".encode())
    expected = ["hello world", "second\rline", "last"]
    assert read_lines(path) == expected
    assert list(module._lines_of_files([path])) == expected


# Command line


def test_cli_saves_a_loadable_tokenizer_equal_to_the_function(tmp_path, capsys):
    source = _write_lines(tmp_path / "train.en", CORPUS[::2])
    target = _write_lines(tmp_path / "train.de.gz", CORPUS[1::2])
    output = tmp_path / "out"
    main(
        [str(source), str(target), "--vocab-size", str(VOCAB_SIZE), "--min-frequency", "2", "--output-dir", str(output)]
    )
    assert str(output) in capsys.readouterr().out
    loaded = AutoTokenizer.from_pretrained(output)
    assert type(loaded) is VanillaTransformerTokenizer
    assert _model_json(loaded) == _model_json(train_tokenizer([source, target], vocab_size=VOCAB_SIZE))


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing.txt"), "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "missing.txt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "{tmp}/missing.txt does not exist; fix the path."),
        ("folder", "{tmp} is a folder; give the text files in it"),
        ("bzip2", "training file '{tmp}/corpus.bz2' is bzip2-compressed; decompress it, or recompress it with gzip."),
        ("xz", "training file '{tmp}/corpus.xz' is xz-compressed; decompress it"),
        ("blank", "{tmp}/blank.txt: no sentence, only empty or blank lines"),
        ("vocab", "--vocab-size 100 cannot hold the 256 byte-level symbols"),
        ("frequency", "--min-frequency must be 1 or more, got 0"),
    ],
)
def test_cli_errors_name_the_file_or_flag_in_the_command_lines_words(case, expected, tmp_path, capsys):
    """Not in the Python API's words ("item 0 of texts_or_files", "vocab_size=100"), and a bzip2 or xz file
    is named as such, not read as text that is "not valid UTF-8"."""
    import bz2
    import lzma

    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    (tmp_path / "corpus.bz2").write_bytes(bz2.compress(corpus.read_bytes()))
    (tmp_path / "corpus.xz").write_bytes(lzma.compress(corpus.read_bytes()))
    (tmp_path / "blank.txt").write_text("\n  \n")
    files = {"missing": "missing.txt", "folder": "", "bzip2": "corpus.bz2", "xz": "corpus.xz", "blank": "blank.txt"}
    argv = [str(tmp_path / files.get(case, "corpus.txt")), "--output-dir", str(tmp_path / "out")]
    argv += {"vocab": ["--vocab-size", "100"], "frequency": ["--min-frequency", "0"]}.get(case, [])
    with pytest.raises(SystemExit) as exit_info:
        main([argument.rstrip("/") for argument in argv])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(error.strip().splitlines()) == 1
    assert expected.format(tmp=tmp_path) in error
    assert "texts_or_files" not in error and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.tsv.gz", "pairs.json"])
def test_a_file_of_pairs_is_refused_naming_the_train_command_that_reads_it(name, tmp_path, capsys):
    """The command and train_tokenizer read one sentence a line: a .jsonl was trained on as text, its keys
    ('{"', 'translation') learnt as tokens and its escapes (gro\\u00df) hiding the characters."""
    path = tmp_path / name
    path.write_text(json.dumps({"translation": {"en": "big", "de": "gro\u00df"}}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "holds pairs, not one sentence a line" in error
    assert f"vanilla-transformer train --train_file {path} --tokenizer_only true" in error
    with pytest.raises(ValueError, match=f"training file '{path}' .*: a .* file holds pairs"):
        train_tokenizer([path], vocab_size=VOCAB_SIZE)
    assert not (tmp_path / "out").exists()


def test_cli_takes_underscores_and_refuses_a_file_as_the_output_before_training(tmp_path, capsys):
    """Its help says every flag takes underscores too (the console script calls this function directly); an
    output that is a file is refused before training (save_pretrained would only log an error)."""
    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    main([str(corpus), "--vocab_size", str(VOCAB_SIZE), "--output_dir", str(tmp_path / "out")])
    loaded = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert _model_json(loaded) == _model_json(train_tokenizer([corpus], vocab_size=VOCAB_SIZE))
    capsys.readouterr()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main([str(corpus), "--vocab-size", str(VOCAB_SIZE), "--output-dir", str(tmp_path / "a-file")])
    assert exit_info.value.code == 2 and "--output-dir" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == ""


@pytest.mark.parametrize("where", ["under a file", "unwritable"])
def test_cli_refuses_an_output_folder_it_cannot_create_before_training(tmp_path, capsys, monkeypatch, where):
    """A folder to create under a file, or in a folder one cannot write, failed when the tokenizer was saved,
    after training (hours on WMT): a traceback from the console script, the trained vocabulary lost."""
    import vanilla_transformer.command_line as command_line

    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "tok" if where == "under a file" else tmp_path / "locked" / "tok"
    if where == "unwritable":  # as a non-root user has it (root may write anywhere)
        (tmp_path / "locked").mkdir()
        monkeypatch.setattr(command_line.os, "access", lambda path, mode: Path(path) != tmp_path / "locked")
    monkeypatch.setattr(sys.modules[main.__module__], "train_tokenizer", lambda *a, **k: pytest.fail("trained first"))
    with pytest.raises(SystemExit) as exit_info:
        main([str(corpus), "--vocab-size", str(VOCAB_SIZE), "--output-dir", str(output)])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(error.strip().splitlines()) == 1, error
    reason = f"lies under {tmp_path / 'a-file'}, a file" if where == "under a file" else "cannot be written"
    assert f"--output-dir {output}" in error and reason in error


def test_cli_refuses_to_replace_a_tokenizer_or_a_models_without_force(tmp_path, capsys):
    """Saving a new tokenizer into a trained model's folder silently gave that model another vocabulary (its
    translations turned to noise); into a tokenizer's folder, it replaced that one."""
    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    first = _write_lines(tmp_path / "first.txt", CORPUS[:40])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    main([str(first), "--vocab-size", str(VOCAB_SIZE), "--output-dir", str(tmp_path / "tok")])
    before = (tmp_path / "tok" / "tokenizer.json").read_bytes()
    for folder, what in ((model, "a model, whose weights need the tokenizer"), (tmp_path / "tok", "a tokenizer")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main([str(corpus), "--vocab-size", str(VOCAB_SIZE), "--output-dir", str(folder)])
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"--output-dir {folder} already holds {what}" in error, error
        assert "--force to replace it" in error
    assert (tmp_path / "tok" / "tokenizer.json").read_bytes() == before and not (model / "tokenizer.json").exists()
    main([str(corpus), "--vocab-size", str(VOCAB_SIZE), "--output-dir", str(tmp_path / "tok"), "--force"])
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert _model_json(loaded) == _model_json(train_tokenizer([corpus], vocab_size=VOCAB_SIZE))


def test_python_dash_m_saves_remote_code_and_auto_map(tmp_path):
    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    output = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "vanilla_transformer.tokenization_vanilla_transformer",
        str(corpus),
        "--vocab-size",
        str(VOCAB_SIZE),
        "--output-dir",
        str(output),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # Run as __main__, the module must still save the package's registered class.
    assert (output / "tokenization_vanilla_transformer.py").is_file()
    assert "auto_map" in json.loads((output / "tokenizer_config.json").read_text())


# The real corpus


@pytest.mark.slow
def test_multi30k_training_set_round_trips_without_unk():
    data = SHARED_DIR / "data" / "multi30k"
    files = [data / "train.en.gz", data / "train.de.gz"]
    if not all(path.is_file() for path in files):
        pytest.skip(f"Multi30k not found under {data} (set VT_SHARED_DIR)")
    tokenizer = train_tokenizer(files, vocab_size=8000)
    english, german = ([line.rstrip("\n") for line in gzip.open(path, "rt", encoding="utf-8")] for path in files)

    start = time.perf_counter()
    encoded = tokenizer(english, text_target=german)
    print(f"\ntokenised {len(english)} Multi30k pairs in {time.perf_counter() - start:.2f} s")

    assert len(encoded.input_ids) == len(encoded["labels"]) == len(english) == 29000
    for ids in encoded.input_ids + encoded["labels"]:
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.unk_token_id not in ids
    decoded = tokenizer.batch_decode(encoded.input_ids + encoded["labels"], skip_special_tokens=True)
    assert decoded == [unicodedata.normalize("NFKC", line) for line in english + german]


def test_a_new_special_token_is_said_not_to_match_in_text_and_add_tokens_matches_it(tokenizer, caplog):
    import copy

    from transformers.utils import logging as transformers_logging

    mine = copy.deepcopy(tokenizer)
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            mine.add_special_tokens({"additional_special_tokens": ["<2de>"]})
    finally:
        transformers_logging.disable_propagation()
    assert any(
        "<2de>: special tokens of this tokenizer are not matched in text" in r.getMessage() for r in caplog.records
    )
    assert mine.convert_tokens_to_ids("<2de>") not in mine("<2de> a man")["input_ids"]  # what the warning says
    mine.add_tokens(["<2fr>"])
    assert mine("<2fr> a man")["input_ids"][0] == mine.convert_tokens_to_ids("<2fr>")


@pytest.mark.parametrize("flag", ["--vocab-siz", "--vocab", "--vocab_siz"])
def test_cli_refuses_an_abbreviated_or_misspelt_flag_naming_the_closest(tmp_path, capsys, flag):
    """argparse took --vocab as --vocab-size (a new --vocab-... flag would have changed its meaning); every
    other command refuses it with the closest flag."""
    corpus = _write_lines(tmp_path / "corpus.txt", CORPUS)
    with pytest.raises(SystemExit) as exit_info:
        main([str(corpus), flag, str(VOCAB_SIZE), "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"{flag} is not a flag" in error and "did you mean --vocab-size?" in error
    assert not (tmp_path / "out").exists()
