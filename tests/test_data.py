"""training/data.py: reading parallel text, the length filter and the token-count batch sampler."""

import gzip
import json
import logging
import random
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from data import (  # noqa: E402
    TokenBatchSampler,
    filter_by_length,
    read_jsonl,
    read_parallel,
    read_tsv,
    tokenize_pairs,
)

SOURCES = ["A dog runs.", "  leading and trailing spaces  ", "", "Ünïcödé ✓ and a tab\there"]
TARGETS = ["Ein Hund rennt.", "\tführende Leerzeichen ", "leer links", "Unicode"]


def write(path: Path, lines: list[str], compress: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


# --- reading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_read_parallel_plain_and_gzip_keeps_everything_but_the_newline(tmp_path, compress):
    # Deliberately no ".gz" suffix: compression is detected from the content.
    src = write(tmp_path / "train.src", SOURCES, compress)
    tgt = write(tmp_path / "train.tgt", TARGETS, compress)
    assert read_parallel(src, tgt) == list(zip(SOURCES, TARGETS))


def test_read_parallel_mixed_compression_crlf_and_lone_carriage_return(tmp_path):
    src = write(tmp_path / "a.gz", ["one", "two"], compress=True)
    tgt = tmp_path / "b.txt"
    tgt.write_bytes("eins\r\nzwei \r mitten\r\n".encode())  # a lone "\r" is text, not a line break
    assert read_parallel(src, tgt) == [("one", "eins"), ("two", "zwei \r mitten")]


def test_read_parallel_last_line_without_newline(tmp_path):
    src, tgt = tmp_path / "s", tmp_path / "t"
    src.write_text("a\nb")
    tgt.write_text("x\ny\n")
    assert read_parallel(src, tgt) == [("a", "x"), ("b", "y")]


def test_read_parallel_misaligned_names_both_files_and_counts(tmp_path):
    src = write(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write(tmp_path / "train.de.gz", ["x", "y"], compress=True)
    with pytest.raises(ValueError) as error:
        read_parallel(src, tgt)
    message = str(error.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "has 2" in message


def test_missing_file_is_file_not_found_with_the_path(tmp_path):
    missing = tmp_path / "nope.en"
    other = write(tmp_path / "ok.de", ["x"])
    for call in (lambda: read_parallel(missing, other), lambda: read_tsv(missing),
                 lambda: read_jsonl(missing, "en", "de")):
        with pytest.raises(FileNotFoundError, match="nope.en"):
            call()


def test_invalid_utf8_names_the_file(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Grüße\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt.*not valid UTF-8"):
        read_parallel(bad, bad)


def test_read_tsv_columns_and_gzip(tmp_path):
    path = write(tmp_path / "pairs.tsv", ["1\tA dog.\tEin Hund.", "2\t\"quoted\"\t'x' "], compress=True)
    assert read_tsv(path, source_column=1, target_column=2) == [("A dog.", "Ein Hund."), ('"quoted"', "'x' ")]
    assert read_tsv(path, source_column=2, target_column=0) == [("Ein Hund.", "1"), ("'x' ", "2")]


def test_read_tsv_too_few_columns_names_the_line(tmp_path):
    path = write(tmp_path / "pairs.tsv", ["a\tb", "c\td", "only one field"])
    with pytest.raises(ValueError, match=r"line 3: too few columns, found 1 .* need at least 2"):
        read_tsv(path)
    with pytest.raises(ValueError, match="line 1: too few columns"):
        read_tsv(path, 0, 2)


def test_read_jsonl_flat_nested_and_blank_lines(tmp_path):
    lines = [json.dumps({"en": "A dog.", "de": "Ein Hund.", "id": 1}), "",
             json.dumps({"en": "Ä", "de": "B", "translation": {"en": "x"}})]
    path = write(tmp_path / "pairs.jsonl", lines)
    assert read_jsonl(path, "en", "de") == [("A dog.", "Ein Hund."), ("Ä", "B")]
    nested = write(tmp_path / "wmt.jsonl.gz", [json.dumps({"translation": {"de": "Hallo", "en": "Hello"}})], True)
    assert read_jsonl(nested, "translation.en", "translation.de") == [("Hello", "Hallo")]


@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ('{"en": "a"}', r"line 2: missing key 'de' \(keys present: \['en'\]\)"),
        ('{"en": "a", "de": 5}', "line 2: 'de' must be a string, got int"),
        ('{"en": "a", "de": "b"', r"line 2: invalid JSON"),
        ('["a", "b"]', "line 2: expected a JSON object, got list"),
    ],
)
def test_read_jsonl_malformed_line_says_where_and_what(tmp_path, bad_line, expected):
    path = write(tmp_path / "pairs.jsonl", [json.dumps({"en": "ok", "de": "ok"}), bad_line])
    with pytest.raises(ValueError, match=expected):
        read_jsonl(path, "en", "de")


# --- length filter ---------------------------------------------------------------------------


def example(source_length: int, target_length: int, token: int = 7) -> dict:
    return {"input_ids": [token] * source_length, "labels": [token] * target_length}


def test_filter_by_length_counts_and_logs_what_it_drops(caplog):
    examples = [example(3, 3), example(5, 2), example(6, 2), example(2, 5), example(2, 6),
                example(0, 2), example(2, 0), example(1, 1)]
    with caplog.at_level(logging.INFO, logger="data"):
        kept, dropped = filter_by_length(examples, max_source_tokens=5, max_target_tokens=5)
    assert kept == [examples[i] for i in (0, 1, 3, 7)]  # order kept, limits inclusive
    assert dropped == 4
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "dropped 4 of 8 examples (2 empty, 2 longer than 5 source / 5 target" in record.getMessage()


def test_filter_by_length_special_tokens_do_not_count_as_content(caplog):
    eos, pad = 3, 0
    examples = [{"input_ids": [eos], "labels": [9, eos]}, {"input_ids": [9, eos], "labels": [pad, eos]},
                {"input_ids": [9, eos], "labels": [9, eos]}]
    kept, dropped = filter_by_length(examples, 10, 10, special_token_ids=[pad, eos])
    assert (kept, dropped) == ([examples[2]], 2)


def test_filter_by_length_logs_even_when_nothing_is_dropped(caplog):
    with caplog.at_level(logging.INFO, logger="data"):
        assert filter_by_length([example(1, 1)], 4, 4) == ([example(1, 1)], 0)
    assert "dropped 0 of 1" in caplog.text


def test_filter_by_length_rejects_untokenized_pairs_and_bad_limits():
    with pytest.raises(TypeError, match="tokenise first"):
        filter_by_length([("a dog", "ein Hund")], 5, 5)
    with pytest.raises(ValueError, match="max_target_tokens must be a positive integer"):
        filter_by_length([example(1, 1)], 5, 0)


# --- token batch sampler ---------------------------------------------------------------------


def random_lengths(rng: random.Random, n: int, max_length: int, pairs: bool):
    if pairs:
        return [(rng.randint(1, max_length), rng.randint(1, max_length)) for _ in range(n)]
    return [rng.randint(1, max_length) for _ in range(n)]


def as_pair(length):
    return (length, length) if isinstance(length, int) else length


def padded_tokens(batch, lengths) -> int:
    return len(batch) * max(max(as_pair(lengths[i])) for i in batch)


def reference_sorted_order(lengths) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (as_pair(lengths[i]), i))


CASES = [(seed, pairs) for seed in range(40) for pairs in (False, True)]


@pytest.mark.parametrize("seed, pairs", CASES)
def test_sampler_properties_on_random_lengths(seed, pairs):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    lengths = random_lengths(rng, n, max_length=rng.randint(1, 120), pairs=pairs)
    longest = max(max(as_pair(x)) for x in lengths)
    max_tokens = rng.randint(longest, longest * 20)
    sampler = TokenBatchSampler(lengths, max_tokens, seed=seed)
    batches = list(sampler)

    assert len(sampler) == len(batches)
    assert all(padded_tokens(b, lengths) <= max_tokens for b in batches)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))  # every example exactly once

    # Length-homogeneous: each batch is a contiguous run of the length-sorted order.
    position = {index: p for p, index in enumerate(reference_sorted_order(lengths))}
    runs = sorted([position[i] for i in b] for b in batches)
    for run in runs:
        assert sorted(run) == list(range(min(run), min(run) + len(run)))
    # Greedy: a batch could not have taken the next example in sorted order.
    order = reference_sorted_order(lengths)
    for run in runs[:-1]:
        grown = [order[p] for p in run] + [order[max(run) + 1]]
        assert padded_tokens(grown, lengths) > max_tokens


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


def test_sampler_without_shuffle_goes_shortest_first():
    lengths = [5, 1, 4, 2, 3, 1]
    assert list(TokenBatchSampler(lengths, max_tokens=6, shuffle=False)) == [[1, 5, 3], [4], [2], [0]]


def test_sampler_example_longer_than_max_tokens_is_an_error():
    with pytest.raises(ValueError, match=r"Example 2 has 11 tokens \(source 3, target 11\).*filter_by_length"):
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


def ranks(lengths, max_tokens, num_replicas, epoch=0, **kwargs):
    samplers = [TokenBatchSampler(lengths, max_tokens, num_replicas=num_replicas, rank=r, **kwargs)
                for r in range(num_replicas)]
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
    with caplog.at_level(logging.WARNING, logger="data"):
        _, per_rank = ranks([1, 1], max_tokens=2, num_replicas=3, drop_last=True)
    assert per_rank == [[], [], []] and "every rank gets no batch" in caplog.text


# --- end to end: tokenizer -> filter -> sampler -> DataLoader -> collator ---------------------


def test_dataloader_with_collator_stays_within_max_tokens(tmp_path):
    from vanilla_transformer import train_tokenizer

    rng = random.Random(0)
    words = "the a dog cat runs sleeps over under big small red house tree river".split()
    sources = [" ".join(rng.choices(words, k=rng.randint(0, 25))) for _ in range(200)]
    targets = [" ".join(rng.choices(words, k=rng.randint(1, 25)))[::-1] for _ in range(200)]
    src = write(tmp_path / "train.en", sources)
    tgt = write(tmp_path / "train.de.gz", targets, compress=True)
    pairs = read_parallel(src, tgt)
    tokenizer = train_tokenizer(iter(sources + targets), vocab_size=300)

    examples = tokenize_pairs(pairs, tokenizer)
    assert examples[0]["input_ids"] == tokenizer(pairs[0][0])["input_ids"]
    kept, dropped = filter_by_length(examples, 40, 40, special_token_ids=tokenizer.all_special_ids)
    too_long_or_empty = [not s or len(tokenizer(s)["input_ids"]) > 40 or len(tokenizer(t)["input_ids"]) > 40
                         for s, t in pairs]
    assert dropped == sum(too_long_or_empty) and 0 < sum(not s for s in sources) < dropped < len(pairs)
    max_tokens = 160
    lengths = [(len(e["input_ids"]), len(e["labels"])) for e in kept]
    sampler = TokenBatchSampler(lengths, max_tokens=max_tokens, seed=0)
    loader = DataLoader(kept, batch_sampler=sampler, collate_fn=DataCollatorForSeq2Seq(tokenizer))

    seen = 0
    for batch in loader:
        assert batch["input_ids"].numel() <= max_tokens and batch["labels"].numel() <= max_tokens
        assert batch["input_ids"].shape[0] == batch["labels"].shape[0]
        seen += batch["input_ids"].shape[0]
    assert seen == len(kept) and len(loader) == len(sampler)
