"""benchmarks/batch_fill.py: sentences and real tokens per token batch, with and without bucket shapes."""

import gzip
import random

import pytest

from helpers import load_script

batch_fill = load_script("benchmarks/batch_fill.py")


def test_batch_fill_counts_the_batches_the_sampler_makes(tmp_path):
    rng = random.Random(0)
    words = "ein Hund ein Mann zwei Frauen sitzen auf einer Bank im Park und lesen".split()
    for side in ("en", "de"):
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 20))) for _ in range(400)]
        with gzip.open(tmp_path / f"train.{side}.gz", "wt", encoding="utf-8") as file:
            file.write("".join(line + "\n" for line in lines))
    exact, bucketed = batch_fill.main(["--data-dir", str(tmp_path), "--max-tokens", "128", "--vocab-size", "300"])
    assert (exact["pad_to_buckets"], bucketed["pad_to_buckets"]) == (False, True)
    lengths = batch_fill.corpus_lengths(batch_fill.parse_args(["--data-dir", str(tmp_path), "--vocab-size", "300"]))
    for result in (exact, bucketed):
        assert result["pairs"] == 400
        assert result["sentences_per_batch"] == round(400 / result["batches"], 1)
        assert result["real_share_of_padded_tokens"] == round(lengths.sum() / (2 * 128 * result["batches"]), 4)
    assert bucketed["batches"] >= exact["batches"]  # padding to buckets can only take room from sentences


def test_files_of_different_lengths_are_refused_naming_both(tmp_path):
    for side, count in (("en", 5), ("de", 4)):
        with gzip.open(tmp_path / f"train.{side}.gz", "wt", encoding="utf-8") as file:
            file.write("ein Hund\n" * count)
    with pytest.raises(ValueError, match=r"train\.en\.gz' has 5 lines but .*train\.de\.gz' has 4"):
        batch_fill.main(["--data-dir", str(tmp_path), "--vocab-size", "300"])
