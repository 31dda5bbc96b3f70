"""vanilla_transformer.training.data and .batching: reading rules, Arrow datasets, tokenising, the
length filter and token-count batches, each checked against an independent reference (the bytes
written, the tokenizer called directly, a brute-force packing)."""

import bz2
import gzip
import json
import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from vanilla_transformer import train_tokenizer
from vanilla_transformer.training import data
from vanilla_transformer.training.batching import PadToBucket, TokenBatchSampler
from vanilla_transformer.training.data import (
    drop_unusable,
    example_lengths,
    jsonl_dataset,
    parallel_text_dataset,
    read_parallel,
    tokenize_dataset,
    tsv_dataset,
)

SOURCES = ["A dog runs.", "  leading and trailing spaces  ", "", "Ünïcödé ✓ and a tab\there"]
TARGETS = ["Ein Hund rennt.", "\tführende Leerzeichen ", "leer links", "Unicode"]


def write(path: Path, lines: list[str], compress: bool = False) -> Path:
    content = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(content) if compress else content)
    return path


def pairs(dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["source"], dataset["target"]))


@pytest.fixture
def cache(tmp_path) -> str:
    return str(tmp_path / "cache")


# --- reading: every format into Arrow by the same rules -------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_parallel_files_keep_everything_but_the_newline_one_row_per_line(tmp_path, cache, compress):
    # Deliberately no ".gz" suffix: compression is detected from the content.
    src = write(tmp_path / "train.src", SOURCES, compress)
    tgt = write(tmp_path / "train.tgt", TARGETS, compress)
    dataset = parallel_text_dataset(src, tgt, cache_dir=cache)
    assert dataset.column_names == ["source", "target"] and len(dataset) == len(SOURCES)
    assert pairs(dataset) == list(zip(SOURCES, TARGETS)) == read_parallel(src, tgt)


def test_mixed_compression_crlf_bom_and_lone_carriage_return(tmp_path, cache):
    src = write(tmp_path / "a.gz", ["one", "two"], compress=True)
    tgt = tmp_path / "b.txt"
    tgt.write_bytes("\ufeffeins\r\nzwei \r mitten\r\n".encode())  # a lone "\r" is text, not a line break
    assert pairs(parallel_text_dataset(src, tgt, cache_dir=cache)) == [("one", "eins"), ("two", "zwei \r mitten")]


def test_last_line_without_newline(tmp_path, cache):
    src, tgt = tmp_path / "s", tmp_path / "t"
    src.write_text("a\nb")
    tgt.write_text("x\ny\n")
    assert pairs(parallel_text_dataset(src, tgt, cache_dir=cache)) == [("a", "x"), ("b", "y")]


def test_misaligned_files_name_both_files_flags_and_counts(tmp_path, cache):
    src = write(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write(tmp_path / "train.de.gz", ["x", "y"], compress=True)
    with pytest.raises(ValueError) as error:
        parallel_text_dataset(src, tgt, ("--train_source_file", "--train_target_file"), cache_dir=cache)
    message = str(error.value)
    assert str(src) in message and str(tgt) in message and "--train_target_file" in message
    assert "has 3 lines" in message and "has 2" in message


def test_a_changed_file_is_read_again_not_taken_from_the_cache(tmp_path, cache):
    src, tgt = write(tmp_path / "s", ["a", "b"]), write(tmp_path / "t", ["x", "y"])
    assert pairs(parallel_text_dataset(src, tgt, cache_dir=cache)) == [("a", "x"), ("b", "y")]
    again = parallel_text_dataset(src, tgt, cache_dir=cache)
    assert pairs(again) == [("a", "x"), ("b", "y")]
    write(tgt, ["x", "changed"])
    os.utime(tgt, ns=(1, 10**18))  # a different modification time, whatever the clock's resolution
    assert pairs(parallel_text_dataset(src, tgt, cache_dir=cache)) == [("a", "x"), ("b", "changed")]
    # the same size and modification time as before (cp -p, rsync -a, tar x): the status change time differs
    write(tgt, ["x", "changes"])
    os.utime(tgt, ns=(1, 10**18))
    assert pairs(parallel_text_dataset(src, tgt, cache_dir=cache)) == [("a", "x"), ("b", "changes")]


def test_missing_file_is_file_not_found_with_the_path_and_flag(tmp_path, cache):
    missing = tmp_path / "nope.en"
    other = write(tmp_path / "ok.de", ["x"])
    for call in (
        lambda: parallel_text_dataset(missing, other, ("--train_source_file", "--t"), cache_dir=cache),
        lambda: tsv_dataset(missing, what="--train_source_file", cache_dir=cache),
        lambda: jsonl_dataset(missing, "en", "de", what="--train_source_file", cache_dir=cache),
    ):
        with pytest.raises(FileNotFoundError, match="--train_source_file.*nope.en"):
            call()


def test_invalid_utf8_names_the_file_and_the_line(tmp_path, cache):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("fine\nGrüße\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt', line 2: not valid UTF-8"):
        parallel_text_dataset(bad, bad, cache_dir=cache)


def test_a_truncated_gzip_file_is_named_not_read_in_part(tmp_path, cache):
    whole = gzip.compress("".join(f"sentence {i}\n" for i in range(5000)).encode())
    broken = tmp_path / "broken.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="broken.gz.*damaged or truncated gzip"):
        parallel_text_dataset(broken, broken, cache_dir=cache)


def test_other_compressions_empty_files_and_directories_are_refused(tmp_path, cache):
    ok = write(tmp_path / "ok", ["x"])
    packed = tmp_path / "data.bz2"
    packed.write_bytes(bz2.compress(b"a\n"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, expected in (
        (packed, "bzip2-compressed"),
        (empty, "is empty"),
        (tmp_path, "is a directory"),
        (fifo, "not a regular file"),
    ):
        with pytest.raises((ValueError, OSError), match=expected):
            parallel_text_dataset(path, ok, ("--train_source_file", "--train_target_file"), cache_dir=cache)


def test_a_gz_suffix_on_plain_text_reads_the_text(tmp_path, cache, caplog):
    plain = write(tmp_path / "looks.gz", ["a"])
    with caplog.at_level(logging.WARNING):
        assert pairs(parallel_text_dataset(plain, plain, cache_dir=cache)) == [("a", "a")]
    assert "not gzip-compressed" in caplog.text


def test_tsv_columns_and_gzip(tmp_path, cache):
    path = write(tmp_path / "pairs.tsv", ["1\tA dog.\tEin Hund.", "2\t\"quoted\"\t'x' "], compress=True)
    assert pairs(tsv_dataset(path, 1, 2, cache_dir=cache)) == [("A dog.", "Ein Hund."), ('"quoted"', "'x' ")]
    assert pairs(tsv_dataset(path, 2, 0, cache_dir=cache)) == [("Ein Hund.", "1"), ("'x' ", "2")]


def test_tsv_too_few_fields_or_a_tab_inside_a_sentence_names_the_line(tmp_path, cache):
    short = write(tmp_path / "short.tsv", ["a\tb", "c\td", "only one field"])
    with pytest.raises(ValueError, match=r"line 3: 1 tab-separated field\(s\), need at least 2"):
        tsv_dataset(short, cache_dir=cache)
    with pytest.raises(ValueError, match=r"line 1: 2 tab-separated field\(s\), need at least 3"):
        tsv_dataset(short, 0, 2, cache_dir=cache)
    tabbed = write(tmp_path / "tabbed.tsv", ["a\tb", "c\td\te"])
    with pytest.raises(ValueError, match="line 2: 3 tab-separated.*tab inside a sentence"):
        tsv_dataset(tabbed, cache_dir=cache)
    with pytest.raises(ValueError, match="0-based non-negative"):
        tsv_dataset(short, -1, 1, cache_dir=cache)


def test_jsonl_flat_nested_and_blank_lines(tmp_path, cache):
    lines = [
        json.dumps({"en": "A dog.", "de": "Ein Hund.", "id": 1}),
        "",
        json.dumps({"en": "Ä", "de": "B", "translation": {"en": "x"}}),
    ]
    path = write(tmp_path / "pairs.jsonl", lines)
    assert pairs(jsonl_dataset(path, "en", "de", cache_dir=cache)) == [("A dog.", "Ein Hund."), ("Ä", "B")]
    nested = write(tmp_path / "wmt.jsonl.gz", [json.dumps({"translation": {"de": "Hallo", "en": "Hello"}})], True)
    assert pairs(jsonl_dataset(nested, "translation.en", "translation.de", cache_dir=cache)) == [("Hello", "Hallo")]


@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ('{"en": "a"}', r"line 2: missing key 'de' \(keys present: \['en'\]\)"),
        ('{"en": "a", "de": 5}', "line 2: 'de' must be a string, got int"),
        ('{"en": "a", "de": "b"', r"line 2: invalid JSON"),
        ('["a", "b"]', "line 2: expected a JSON object, got list"),
        # present but null: it said "missing key 'translation.de' (keys present: ['translation'])"
        ('{"translation": null}', "line 2: 'translation' is null, not an object holding 'de'"),
        # half of an emoji, valid JSON: Arrow failed on it with a UnicodeEncodeError naming no file or line
        ('{"translation": {"de": "cut \\ud83d"}}', r"line 2: 'translation.de' holds a lone surrogate \('\\ud83d' at"),
    ],
)
def test_jsonl_malformed_line_says_where_and_what(tmp_path, cache, bad_line, expected):
    nested = "translation" in bad_line
    first = {"translation": {"en": "ok", "de": "ok"}} if nested else {"en": "ok", "de": "ok"}
    path = write(tmp_path / "pairs.jsonl", [json.dumps(first), bad_line])
    keys = ("translation.de", "translation.en") if nested else ("en", "de")
    with pytest.raises(ValueError, match=expected):
        jsonl_dataset(path, *keys, cache_dir=cache)


def test_text_that_starts_like_a_bzip2_header_is_read_as_text(tmp_path, cache):
    """Any file starting "BZh" was refused as bzip2 (an id "BZh-001", a city "BZhangzhou"); a bzip2 stream
    is "BZh", a level 1-9, then a block's magic."""
    ids = write(tmp_path / "ids.tsv", ["BZh-001\tA dog.\tEin Hund."])
    assert pairs(tsv_dataset(ids, 1, 2, cache_dir=cache)) == [("A dog.", "Ein Hund.")]
    text = write(tmp_path / "city.txt", ["BZhangzhou is a city."])
    assert pairs(parallel_text_dataset(text, text, cache_dir=cache)) == [("BZhangzhou is a city.",) * 2]
    packed = tmp_path / "real.txt"
    packed.write_bytes(bz2.compress(b"BZhangzhou\n"))
    with pytest.raises(ValueError, match="bzip2-compressed"):
        parallel_text_dataset(packed, packed, cache_dir=cache)


def test_the_token_ids_cache_key_ignores_the_truncation_a_last_call_left_set(tokenizer):
    """A tokenizer called with truncation or padding keeps them set in its backend, which the key hashed: the
    corpus was tokenised again for ids that do not change."""
    before = data.tokenizer_fingerprint(tokenizer)
    tokenizer(["the dog runs", "a"], truncation=True, max_length=2, padding=True)
    assert tokenizer.backend_tokenizer.truncation is not None  # the state the key must not see
    assert data.tokenizer_fingerprint(tokenizer) == before
    tokenizer(["a"], truncation=False, padding=False)
    changed = train_tokenizer(iter("the a dog cat runs".split() * 20), vocab_size=280)
    assert data.tokenizer_fingerprint(changed) != before  # another vocabulary, another key


# --- tokenising and the length filter ---------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    words = "the a dog cat runs sleeps over under big small red house tree river".split()
    return train_tokenizer(iter(words * 20 + ["Hund Katze läuft"] * 20), vocab_size=300)


def test_token_ids_are_the_tokenizers_and_stored_as_int32(tmp_path, cache, tokenizer):
    src = write(tmp_path / "s", ["the dog runs", "", "a big red house under the tree"])
    tgt = write(tmp_path / "t", ["Hund läuft", "Katze", "  "])
    ids = tokenize_dataset(parallel_text_dataset(src, tgt, cache_dir=cache), tokenizer)
    assert ids.features["input_ids"].feature.dtype == "int32"
    for row, (source, target) in zip(ids, pairs(parallel_text_dataset(src, tgt, cache_dir=cache))):
        assert row["input_ids"] == tokenizer(source)["input_ids"]
        assert row["labels"] == tokenizer(text_target=target)["input_ids"]
        assert (row["source_length"], row["target_length"]) == (len(row["input_ids"]), len(row["labels"]))
    assert ids["empty"][:] == [False, True, True]  # nothing, or only whitespace, on a side


def test_tokenising_twice_reuses_the_cache_and_another_tokenizer_does_not(tmp_path, cache, tokenizer):
    text = parallel_text_dataset(
        write(tmp_path / "s", ["the dog"] * 3), write(tmp_path / "t", ["Hund"] * 3), cache_dir=cache
    )
    first, second = tokenize_dataset(text, tokenizer), tokenize_dataset(text, tokenizer)
    assert first._fingerprint == second._fingerprint and first.cache_files == second.cache_files
    other = train_tokenizer(iter(["something else entirely"] * 5), vocab_size=270)
    assert tokenize_dataset(text, other)._fingerprint != first._fingerprint


def test_drop_unusable_counts_and_logs_what_it_drops(tmp_path, cache, tokenizer, caplog):
    rng = random.Random(0)
    words = "the a dog cat runs big red house tree".split()
    sources = [" ".join(rng.choices(words, k=rng.randint(0, 12))) for _ in range(300)]
    targets = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(300)]
    text = parallel_text_dataset(write(tmp_path / "s", sources), write(tmp_path / "t", targets), cache_dir=cache)
    with caplog.at_level(logging.INFO, logger=data.__name__):
        kept, counts = drop_unusable(tokenize_dataset(text, tokenizer), 9, 11, role="train")
    # Reference: the tokenizer called on each pair, the limits applied in plain Python.
    expected = [
        i
        for i, (s, t) in enumerate(zip(sources, targets))
        if s.strip() and len(tokenizer(s)["input_ids"]) <= 9 and len(tokenizer(t)["input_ids"]) <= 11
    ]
    assert kept["input_ids"][:] == [tokenizer(sources[i])["input_ids"] for i in expected]  # order kept
    empty = sum(not s.strip() for s in sources)
    assert counts == {"kept": len(expected), "empty": empty, "too_long": 300 - len(expected) - empty}
    assert 0 < empty and 0 < counts["too_long"]
    assert f"dropped {300 - len(expected)} ({empty} empty" in caplog.text
    # which pairs are kept is written beside the data (memory-mapped), and the next process reads it from there
    assert len(kept.cache_files) == len(tokenize_dataset(text, tokenizer).cache_files) + 1  # the kept indices
    again, _ = drop_unusable(tokenize_dataset(text, tokenizer), 9, 11, role="train")
    assert again.cache_files == kept.cache_files and again["input_ids"][:] == kept["input_ids"][:]


def test_drop_unusable_logs_even_when_nothing_is_dropped_and_refuses_to_leave_nothing(
    tmp_path, cache, tokenizer, caplog
):
    text = parallel_text_dataset(write(tmp_path / "s", ["the dog"]), write(tmp_path / "t", ["Hund"]), cache_dir=cache)
    ids = tokenize_dataset(text, tokenizer)
    with caplog.at_level(logging.INFO, logger=data.__name__):
        kept, counts = drop_unusable(ids, 50, 50)
    assert len(kept) == 1 and "dropped 0" in caplog.text
    with pytest.raises(ValueError, match="No train pairs left"):
        drop_unusable(ids, 1, 50)
    with pytest.raises(ValueError, match="max_target_tokens must be a positive integer"):
        drop_unusable(ids, 5, 0)


@pytest.mark.parametrize(
    "limits, named",
    [
        (dict(max_tokens=2), "--max_tokens 2, a batch's tokens"),
        (dict(max_source_length=1, max_target_length=50), "--max_source_length 1 / --max_target_length 50"),
        (dict(), None),
    ],
)
def test_what_set_the_length_limit_is_named(tmp_path, cache, tokenizer, caplog, limits, named):
    """A pair dropped as too long, or a set left empty, says which flag (or the model's positions) set the limit."""
    from vanilla_transformer import VanillaTransformerConfig

    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), max_position_embeddings=64)
    text = parallel_text_dataset(
        write(tmp_path / "s", ["the dog runs", "a cat sleeps"]),
        write(tmp_path / "t", ["der Hund rennt", "eine Katze schläft"]),
        cache_dir=cache,
    )
    if named is None:  # the default: the model's positions, every pair kept
        with caplog.at_level(logging.INFO, logger=data.__name__):
            data.tokenize_pairs(text, tokenizer, config)
        assert "kept 2 of 2 pairs; dropped 0 (0 empty, 0 longer than 64 source / 64 target tokens (the model's" in (
            caplog.text
        )
        return
    with pytest.raises(ValueError, match=rf"^No train pairs left: all 2 dropped \(0 empty, 2 longer .*\({named}\)\)"):
        data.tokenize_pairs(text, tokenizer, config, **limits)


def test_example_lengths_from_columns_from_ids_and_from_lists(tmp_path, cache, tokenizer):
    from datasets import Dataset

    text = parallel_text_dataset(
        write(tmp_path / "s", ["the dog", "a", "x y z"]),
        write(tmp_path / "t", ["Hund", "Katze läuft", "b"]),
        cache_dir=cache,
    )
    ids = tokenize_dataset(text, tokenizer)
    expected = [[len(r["input_ids"]), len(r["labels"])] for r in ids]
    assert example_lengths(ids).tolist() == expected
    assert example_lengths(ids.select([2, 0])).tolist() == [expected[2], expected[0]]
    plain = Dataset.from_dict({"input_ids": ids["input_ids"][:], "labels": ids["labels"][:]})
    assert example_lengths(plain).tolist() == expected
    assert example_lengths(list(plain)).tolist() == expected


def test_tokenizer_sample_takes_whole_blocks_up_to_the_requested_pairs(tmp_path, cache):
    count = 5000
    text = parallel_text_dataset(
        write(tmp_path / "s", [f"s{i}" for i in range(count)]),
        write(tmp_path / "t", [f"t{i}" for i in range(count)]),
        cache_dir=cache,
    )
    sample = list(data.tokenizer_training_texts(text, 1500, seed=3, block=500))
    sources = [int(s[1:]) for s in sample if s.startswith("s")]
    assert len(sample) == 2 * 1500 and len(set(sources)) == 1500
    assert all(f"t{i}" in sample for i in sources)  # both sides of each pair
    assert {i // 500 for i in sources} and all(sources.count(i) == 1 for i in sources[:10])
    assert len({i // 500 for i in sources}) == 3  # three whole blocks
    assert len(list(data.tokenizer_training_texts(text, None))) == 2 * count
    for asked in (5, 1200, 4999):  # exactly the pairs asked for (the log says so), whole blocks but the last
        sample = list(data.tokenizer_training_texts(text, asked, seed=3, block=500))
        assert len(sample) == 2 * asked and len({s for s in sample if s.startswith("s")}) == asked


@pytest.mark.parametrize("seed", range(6))
def test_tokenizer_sample_has_the_pairs_asked_for_when_the_short_last_block_is_drawn(tmp_path, cache, seed):
    """2,100 pairs in blocks of 1,000: the last block holds 100. Seeds that drew it (0, 4 and 5) gave 1,100
    pairs for 1,500 asked, while the log said 1,500."""
    text = parallel_text_dataset(
        write(tmp_path / "s", [f"s{i}" for i in range(2100)]),
        write(tmp_path / "t", [f"t{i}" for i in range(2100)]),
        cache_dir=cache,
    )
    sample = list(data.tokenizer_training_texts(text, 1500, seed=seed))
    assert len(sample) == 2 * 1500 and len({s for s in sample if s.startswith("s")}) == 1500


def test_two_runs_training_the_same_tokenizer_at_once_both_go_on(tmp_path, cache, monkeypatch):
    """Runs started together on the same data (a sweep) train the same tokenizer at the same time: each saved it
    to one shared <key>.partial and moved that into place, so the second crashed (FileNotFoundError, or
    "Directory not empty" where the first had already moved its own). Here the other run finishes first, while
    this one trains; the reference is the cached tokenizer the other run left."""
    from vanilla_transformer.training import run

    text = parallel_text_dataset(
        write(tmp_path / "s", [f"source {i} words" for i in range(300)]),
        write(tmp_path / "t", [f"target {i} words" for i in range(300)]),
        cache_dir=cache,
    )
    key = {"vocab_size": 280, "min_frequency": 2, "pairs": 300, "seed": 0, "sample": run.TOKENIZER_SAMPLE_VERSION}
    cached = data.tokenizer_cache_dir(text, key, cache)
    trained = run.train_tokenizer

    def the_other_run_finishes_first(*args, **kwargs):
        tokenizer = trained(*args, **kwargs)
        tokenizer.save_pretrained(cached.with_name(cached.name + ".other.partial"))
        cached.with_name(cached.name + ".other.partial").replace(cached)
        return tokenizer

    monkeypatch.setattr(run, "train_tokenizer", the_other_run_finishes_first)
    tokenizer = run.prepare_tokenizer(text, vocab_size=280, train_pairs=300, seed=0, cache_dir=cache)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(cached).get_vocab()
    assert sorted(path.name for path in cached.parent.iterdir() if path.name.startswith(cached.name)) == [cached.name]


def test_a_tokenizer_cached_from_the_earlier_sample_is_not_reused(tmp_path, cache):
    """The sampler once drew fewer pairs than asked; a tokenizer trained on that sample and cached under the
    same data and settings was reused silently after the fix. Planted here under the earlier key (the settings
    without the sampler's version): the run trains its own."""
    import contextlib

    from vanilla_transformer.training import run

    text = parallel_text_dataset(
        write(tmp_path / "s", [f"source {i} words" for i in range(2100)]),
        write(tmp_path / "t", [f"target {i} words" for i in range(2100)]),
        cache_dir=cache,
    )
    settings = {"vocab_size": 300, "min_frequency": 2, "pairs": 1500, "seed": 0}
    planted = train_tokenizer(iter(["something else entirely"] * 3), vocab_size=270)
    planted.save_pretrained(data.tokenizer_cache_dir(text, settings, cache))
    tokenizer = run.prepare_tokenizer(
        text,
        vocab_size=300,
        train_pairs=1500,
        seed=0,
        cache_dir=cache,
        main_process_first=lambda desc: contextlib.nullcontext(),
    )
    assert tokenizer.get_vocab() != planted.get_vocab()
    assert (
        tokenizer.get_vocab()
        == train_tokenizer(data.tokenizer_training_texts(text, 1500, seed=0), vocab_size=300).get_vocab()
    )


# --- token batch sampler ---------------------------------------------------------------------


def random_lengths(rng: random.Random, n: int, max_length: int, pairs: bool):
    if pairs:
        return [(rng.randint(1, max_length), rng.randint(1, max_length)) for _ in range(n)]
    return [rng.randint(1, max_length) for _ in range(n)]


def as_pair(length):
    return (length, length) if isinstance(length, int) else length


def padded_tokens(batch, lengths) -> int:
    return len(batch) * max(max(as_pair(lengths[i])) for i in batch)


def reference_bucket(length: int, max_tokens: int) -> int:
    """The documented padded lengths: multiples of 8 up to 80, then 88, 96, 112, 128, 144, 160, 176, 200, ..."""
    grid = list(range(8, 81, 8)) + [88, 96, 112, 128, 144, 160, 176, 200, 224, 248, 272]
    return min(next(g for g in grid if g >= length), max_tokens)


CASES = [(seed, pairs) for seed in range(40) for pairs in (False, True)]


@pytest.mark.parametrize("pad_to_buckets", [False, True])
@pytest.mark.parametrize("seed, pairs", CASES)
def test_sampler_properties_on_random_lengths(seed, pairs, pad_to_buckets):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    lengths = random_lengths(rng, n, max_length=rng.randint(1, 120), pairs=pairs)
    longest = max(max(as_pair(x)) for x in lengths)
    max_tokens = rng.randint(longest, longest * 20)
    sampler = TokenBatchSampler(lengths, max_tokens, seed=seed, pad_to_buckets=pad_to_buckets)
    batches = list(sampler)
    padded_to = (lambda length: reference_bucket(length, max_tokens)) if pad_to_buckets else (lambda length: length)

    assert len(sampler) == len(batches) == len(sampler.shapes)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))  # every example exactly once
    for index, batch in enumerate(sampler.batches):
        rows, source, target = sampler.shapes[index].tolist()
        # The shape is the longest source and target, or their buckets: what the batch is padded to.
        assert source == padded_to(max(as_pair(lengths[i])[0] for i in batch))
        assert target == padded_to(max(as_pair(lengths[i])[1] for i in batch))
        assert rows == len(batch) and rows * max(source, target) <= max_tokens
        assert padded_tokens(batch, lengths) <= max_tokens


def greedy_batches(lengths, max_tokens: int) -> list[list[int]]:
    """fairseq's --max-tokens batches, as the sampler made them before bucket shapes (e09363e): pairs sorted
    by (source, target), a batch closed when one more row padded to its longest side would pass max_tokens."""
    pairs = [as_pair(length) for length in lengths]
    batches, batch, longest = [], [], 0
    for index in sorted(range(len(pairs)), key=lambda i: (pairs[i], i)):
        grown = max(longest, *pairs[index])
        if batch and (len(batch) + 1) * grown > max_tokens:
            batches.append(batch)
            batch, grown = [], max(pairs[index])
        batch.append(index)
        longest = grown
    return batches + [batch]


@pytest.mark.parametrize("seed", range(10))
def test_sampler_without_buckets_makes_the_greedy_batches_of_sorted_pairs(seed):
    rng = random.Random(seed)
    lengths = random_lengths(rng, rng.randint(1, 400), max_length=60, pairs=True)
    max_tokens = rng.randint(60, 600)
    sampler = TokenBatchSampler(lengths, max_tokens, shuffle=False)
    assert sampler.batches == greedy_batches(lengths, max_tokens)


def multi30k_like_lengths(count: int, seed: int) -> np.ndarray:
    """Image captions after a joint BPE: about 13-14 tokens a side, rarely over 40."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.rint(rng.lognormal(mean=2.55, sigma=0.35, size=count)), 3, 60).astype(np.int64)
    target = np.clip(np.rint(source * rng.uniform(0.85, 1.3, size=count)), 3, 60).astype(np.int64)
    return np.stack([source, target], axis=1)


def test_short_sentences_fill_a_batch_as_they_did_before_bucket_shapes():
    """The Multi30k recipe's 1,024 padded tokens: without buckets (the default, and the trainer's choice on
    the CPU without --torch_compile) a batch holds as many sentences as e09363e's packing; buckets cost more
    than a tenth of them."""
    lengths = multi30k_like_lengths(29_000, seed=0)
    before = greedy_batches(lengths.tolist(), 1024)
    sentences_before = len(lengths) / len(before)
    default = TokenBatchSampler(lengths, 1024, seed=0)
    assert len(lengths) / default.num_batches >= sentences_before
    bucketed = TokenBatchSampler(lengths, 1024, seed=0, pad_to_buckets=True)
    assert len(lengths) / bucketed.num_batches < 0.9 * sentences_before


def test_sampler_batches_of_a_cell_have_one_shape_and_are_full():
    """Pairs of one (source bucket, target bucket) cell fill batches of max_tokens // longest bucket rows."""
    lengths = [(9, 12)] * 50 + [(3, 5)] * 7 + [(30, 17)] * 21  # cells (16, 16), (8, 8), (32, 24)
    sampler = TokenBatchSampler(lengths, max_tokens=64, shuffle=False, pad_to_buckets=True)
    shapes = [tuple(shape) for shape in sampler.shapes.tolist()]
    # (8, 8): 7 pairs, fewer than its batch of 8: they wait and fill the first (16, 16) batches, each of
    # which holds one pair of its own cell; the last (16, 16) pair fills the first (32, 24) batch.
    assert shapes == [(4, 16, 16)] * 14 + [(2, 32, 24)] * 11
    assert sampler.batches[:3] == [[0, 50, 51, 52], [1, 53, 54, 55], [2, 56, 14, 15]]
    assert sampler.batches[14] == [57, 49]


def test_sampler_on_wmt_like_lengths_has_few_shapes_and_little_padding():
    from helpers import load_script

    lengths = load_script("benchmarks/gpu.py").synthetic_lengths(200_000, seed=0)
    sampler = TokenBatchSampler(lengths, max_tokens=12288, shuffle=False, pad_to_buckets=True)
    shapes = sampler.shapes
    padded = (shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).sum()
    assert len({tuple(shape) for shape in shapes.tolist()}) <= 64  # 1,000 batches of an unbucketed packing: ~900
    assert 1 - lengths.sum() / padded <= 0.12
    assert lengths.sum() / (2 * 12288 * len(shapes)) >= 0.8  # real tokens per batch near max_tokens


def test_sampler_epoch_order_is_deterministic_and_changes_between_epochs():
    lengths = random_lengths(random.Random(0), 500, 50, pairs=True)
    sampler = TokenBatchSampler(lengths, max_tokens=200, seed=1)
    epoch0 = list(sampler)
    assert list(sampler) == epoch0  # same epoch, same order
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0 and sorted(epoch1) == sorted(epoch0)  # same batches, new order
    twin = TokenBatchSampler(lengths, max_tokens=200, seed=1)
    twin.set_epoch(1)
    assert list(twin) == epoch1
    other_seed = TokenBatchSampler(lengths, max_tokens=200, seed=2)
    assert list(other_seed) != epoch0
    assert list(other_seed) != epoch1  # seed 2's first epoch is not seed 1's second: consecutive seeds differ


def test_consecutive_seeds_share_no_epoch_order():
    """Seeds 42, 43, 44 (table3 --seeds 3) over 4 epochs: 12 different orders, none a shifted copy."""
    lengths = random_lengths(random.Random(0), 500, 50, pairs=True)
    orders = []
    for seed in (42, 43, 44):
        sampler = TokenBatchSampler(lengths, max_tokens=200, seed=seed)
        for epoch in range(4):
            sampler.set_epoch(epoch)
            orders.append(tuple(map(tuple, sampler)))
    assert len(set(orders)) == len(orders)


def test_sampler_without_shuffle_goes_shortest_first():
    lengths = [5, 1, 4, 2, 3, 1]
    assert list(TokenBatchSampler(lengths, max_tokens=6, shuffle=False)) == [[1, 5, 3], [4], [2], [0]]
    # bucket_width 1: buckets are the lengths themselves below 10
    bucketed = TokenBatchSampler(lengths, max_tokens=6, shuffle=False, pad_to_buckets=True, bucket_width=1)
    assert list(bucketed) == [[3, 1, 5], [4], [2], [0]]


def test_sampler_example_longer_than_max_tokens_is_an_error():
    with pytest.raises(ValueError, match=r"Example 2 has 11 tokens \(source 3, target 11\).*length filter"):
        TokenBatchSampler([(2, 2), (4, 1), (3, 11)], max_tokens=10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lengths=[1, 0], max_tokens=5), "example 1 must be a positive"),
        (dict(lengths=[1, (2,)], max_tokens=5), "example 1 must be a positive"),
        (dict(lengths=[1, "3"], max_tokens=5), "example 1 must be a positive"),
        (dict(lengths=[], max_tokens=5), "lengths is empty"),
        (dict(lengths=[1], max_tokens=0), "max_tokens must be a positive"),
        (dict(lengths=[1], max_tokens=5, num_replicas=2, rank=2), r"rank must be an int in \[0, 2\)"),
    ],
)
def test_sampler_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TokenBatchSampler(**kwargs)


def test_sampler_accepts_tensor_lengths():
    sampler = TokenBatchSampler(torch.tensor([3, 1, 2]), max_tokens=6, shuffle=False)
    assert list(sampler) == [[1, 2], [0]]
    bucketed = TokenBatchSampler(
        torch.tensor([3, 1, 2]), max_tokens=6, shuffle=False, pad_to_buckets=True, bucket_width=1
    )
    assert list(bucketed) == [[2], [0, 1]]  # 1 waits for a batch of 3s, which has room for it, not for 2


def ranks(lengths, max_tokens, num_replicas, epoch=0, **kwargs):
    samplers = [
        TokenBatchSampler(lengths, max_tokens, num_replicas=num_replicas, rank=r, **kwargs) for r in range(num_replicas)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return samplers, [list(s) for s in samplers]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("num_replicas", [2, 3])
def test_sampler_data_parallel_ranks_split_the_batches(seed, num_replicas):
    rng = random.Random(seed)
    lengths = random_lengths(rng, rng.randint(1, 200), 40, pairs=True)
    max_tokens = rng.randint(40, 300)
    single = TokenBatchSampler(lengths, max_tokens, seed=seed)
    single.set_epoch(seed)
    everything = list(single)  # the same shuffled list every rank starts from
    samplers, per_rank = ranks(lengths, max_tokens, num_replicas, epoch=seed, seed=seed)

    expected_count = -(-len(everything) // num_replicas)
    assert [len(s) for s in samplers] == [len(b) for b in per_rank] == [expected_count] * num_replicas
    # Rank r takes batches r, r + R, ... of the list padded by repeating batches from its start.
    padded = (everything * num_replicas)[: expected_count * num_replicas]
    for rank, batches in enumerate(per_rank):
        assert batches == padded[rank::num_replicas]
    union = [i for batches in per_rank for b in batches for i in b]
    assert set(union) == set(range(len(lengths)))
    if len(everything) % num_replicas == 0:  # nothing repeated: the ranks are disjoint
        assert sorted(union) == list(range(len(lengths)))


def test_sampler_two_ranks_disjoint_equal_and_complete():
    lengths = [5] * 60 + [10] * 40  # max_tokens 10: 30 batches of two, 40 of one, an even count
    samplers, (rank0, rank1) = ranks(lengths, max_tokens=10, num_replicas=2)
    assert len(samplers[0].batches) == 70
    assert len(rank0) == len(rank1) == len(samplers[0])
    seen0, seen1 = {i for b in rank0 for i in b}, {i for b in rank1 for i in b}
    assert not seen0 & seen1
    assert sorted(seen0 | seen1) == list(range(100))
    assert sum(map(len, rank0 + rank1)) == 100


def test_sampler_drop_last_drops_the_remainder_equally():
    lengths = [4] * 7  # max_tokens 4: seven batches of one example
    samplers, per_rank = ranks(lengths, max_tokens=4, num_replicas=3, drop_last=True)
    assert [len(b) for b in per_rank] == [len(s) for s in samplers] == [2, 2, 2]
    flat = [i for batches in per_rank for b in batches for i in b]
    assert len(set(flat)) == 6


def test_sampler_fewer_batches_than_replicas(caplog):
    _, per_rank = ranks([1, 1], max_tokens=2, num_replicas=3)  # one batch, repeated for every rank
    assert per_rank == [[[0, 1]]] * 3
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.batching"):
        _, per_rank = ranks([1, 1], max_tokens=2, num_replicas=3, drop_last=True)
    assert per_rank == [[], [], []] and "every rank gets no batch" in caplog.text


# --- end to end: files -> Arrow -> tokens -> filter -> sampler -> DataLoader -> collator -----


def test_dataloader_with_collator_stays_within_max_tokens(tmp_path, cache):
    rng = random.Random(0)
    words = "the a dog cat runs sleeps over under big small red house tree river".split()
    sources = [" ".join(rng.choices(words, k=rng.randint(0, 25))) for _ in range(200)]
    targets = [" ".join(rng.choices(words, k=rng.randint(1, 25)))[::-1] for _ in range(200)]
    text = parallel_text_dataset(
        write(tmp_path / "train.en", sources), write(tmp_path / "train.de.gz", targets, compress=True), cache_dir=cache
    )
    tokenizer = train_tokenizer(iter(sources + targets), vocab_size=300)
    kept, counts = drop_unusable(tokenize_dataset(text, tokenizer), 40, 40)
    assert 0 < counts["empty"] < 200 - counts["kept"] < 200
    max_tokens = 160
    sampler = TokenBatchSampler(example_lengths(kept), max_tokens=max_tokens, seed=0, pad_to_buckets=True)
    features = kept.select_columns(["input_ids", "labels"])
    collator = PadToBucket(DataCollatorForSeq2Seq(tokenizer), tokenizer.pad_token_id, max_tokens)
    loader = DataLoader(features, batch_sampler=sampler, collate_fn=collator)
    seen, shapes = 0, []
    for batch, indices in zip(loader, sampler):
        assert batch["input_ids"].numel() <= max_tokens and batch["labels"].numel() <= max_tokens
        shapes.append((batch["input_ids"].shape[0], batch["input_ids"].shape[1], batch["labels"].shape[1]))
        assert batch["attention_mask"].sum(1).tolist() == [len(kept[i]["input_ids"]) for i in indices]
        assert (batch["labels"] != -100).sum(1).tolist() == [len(kept[i]["labels"]) for i in indices]
        seen += batch["input_ids"].shape[0]
    assert seen == len(kept) and len(loader) == len(sampler)
    # Padded to the shapes the sampler promised: the bucket of each side's longest sentence.
    assert sorted(shapes) == sorted(map(tuple, sampler.shapes.tolist()))


def test_no_bucket_is_longer_than_the_models_positions():
    """Buckets are 8, 16, ..., 96, 112, ...: a model of 100 positions kept a 99-token pair, and its batch was
    padded to 112, which the model refused mid-training. The reference: the bucket grid, capped by hand."""
    lengths = np.array([[99, 99], [97, 60], [30, 30], [12, 99], [5, 5]])
    sampler = TokenBatchSampler(lengths, max_tokens=400, shuffle=False, pad_to_buckets=True, max_length=100)
    grid = [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112]  # 8 apart to 80, then about 10%
    allowed = {min(bucket, 100) for bucket in grid}
    sides = sampler.shapes[:, 1:]
    assert sampler.longest == 100 and sides.max() == 100 and set(sides.ravel().tolist()) <= allowed
    collate = lambda features: {"input_ids": torch.ones(1, 99, dtype=torch.long)}  # noqa: E731
    assert PadToBucket(collate, 0, sampler.longest)(None)["input_ids"].shape == (1, 100)
    assert PadToBucket(collate, 0, 400)(None)["input_ids"].shape == (1, 112)  # the bucket, uncapped
    with pytest.raises(ValueError, match=r"Example 0 has 99 tokens, more than max_length=98 \(the model's positions"):
        TokenBatchSampler(lengths, max_tokens=400, pad_to_buckets=True, max_length=98)  # not padded to fewer


def test_pad_to_bucket_pads_each_side_to_its_bucket_and_refuses_what_it_cannot_pad():
    def collate(features):
        return {
            "input_ids": torch.ones(2, 9, dtype=torch.long),
            "attention_mask": torch.ones(2, 9, dtype=torch.long),
            "labels": torch.full((2, 3), 7),
        }

    batch = PadToBucket(collate, pad_token_id=5, max_tokens=100)(None)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 16) and batch["labels"].shape == (2, 8)
    assert batch["input_ids"][:, 9:].eq(5).all() and batch["attention_mask"][:, 9:].eq(0).all()
    assert batch["labels"][:, 3:].eq(-100).all() and batch["labels"][:, :3].eq(7).all()
    with pytest.raises(ValueError, match="does not know how to pad the collated 'token_type_ids'"):
        PadToBucket(lambda features: {"token_type_ids": torch.zeros(2, 3)}, 0, 100)(None)


def ctrl_tokenizer(folder: Path, vocabulary: dict[str, int]):
    """A Python (slow) BPE tokenizer, as MarianTokenizer is, from a vocabulary and merges of our own."""
    from transformers import CTRLTokenizer

    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    (folder / "merges.txt").write_text("#version: 0.2\na b</w>\n")
    return CTRLTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def test_a_slow_tokenizer_with_other_ids_for_the_same_tokens_gets_another_cache_key(tmp_path):
    """A slow tokenizer's repr names its path, size and special tokens, not its vocabulary: replacing its files
    by others of the same size must not reuse the token ids cached for the old ones."""
    tokens = ["<unk>", "a", "b", "ab", "a@@", "b@@"]
    one = ctrl_tokenizer(tmp_path / "one", {token: i for i, token in enumerate(tokens)})
    swapped = ctrl_tokenizer(tmp_path / "two", {token: i for i, token in enumerate([*tokens[:3], *tokens[:2:-1]])})
    assert one("ab a").input_ids == [3, 1] and swapped("ab a").input_ids == [5, 1] and len(one) == len(swapped)
    assert data.tokenizer_fingerprint(one) != data.tokenizer_fingerprint(swapped)
    again = ctrl_tokenizer(tmp_path / "again", {token: i for i, token in enumerate(tokens)})
    assert data.tokenizer_fingerprint(one) == data.tokenizer_fingerprint(again)  # the same files, the same key


def test_max_train_samples_reads_only_the_first_pairs_of_each_part_of_a_sum_of_splits(tmp_path, monkeypatch):
    """``--train_split train+test`` with --max_train_samples read the whole train split (only the last part was
    sliced); the pairs kept were right. A local folder of JSON lines stands for a Hub dataset."""
    from vanilla_transformer.training.options import DataArguments

    (tmp_path / "hub" / "data").mkdir(parents=True)
    for split, count in (("train", 30), ("test", 4)):
        write(tmp_path / "hub" / "data" / f"{split}.jsonl",
              [json.dumps({"translation": {"en": f"{split} {i}", "de": f"{i}"}}) for i in range(count)])  # fmt: skip
    read = []
    original = data.hub_dataset
    monkeypatch.setattr(data, "hub_dataset", lambda *a, **k: read.append(original(*a, **k)) or read[-1])
    for split, kept in (
        ("train+test", ["train 0", "train 1", "train 2"]),
        ("test+train", ["test 0", "test 1", "test 2"]),
    ):
        arguments = DataArguments(
            dataset_name=str(tmp_path / "hub"), train_split=split, max_train_samples=3, cache_dir=str(tmp_path / "c")
        )
        loaded = data.load_text_datasets(arguments, seed=1)
        assert loaded["train"]["source"] == kept and len(read[-1]) == 6  # 3 of each part read, 3 kept
