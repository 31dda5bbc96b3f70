"""Caches damaged between two runs are rebuilt with a warning naming them, or named in the error (`training.caches`).

Two runs of train.py's data steps share one ``--cache_dir``; between them, one entry is cut to half
its size (as a full disk or an interrupted copy leaves it) or deleted. The reference is the first
run: the second must give the same token ids and the same tokenizer, and say which entry it rebuilt.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from test_faults import reverse_pairs
from vanilla_transformer.checkpoint_files import DamagedFileError
from vanilla_transformer.training import caches
from vanilla_transformer.training import run as train


def argv(data_dir: Path, cache: Path, output_dir: Path) -> list[str]:
    return [
        "--train_file",
        str(data_dir / "train.tsv"),
        "--validation_size",
        "20",
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "280",
        "--output_dir",
        str(output_dir),
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--max_steps",
        "1",
        "--max_tokens",
        "200",
        "--max_source_length",  # some pairs dropped: the kept ones' indices are a cache entry too
        "5",
        "--cache_dir",
        str(cache),
    ]


def prepared(data_dir: Path, cache: Path, output_dir: Path) -> train.Run:
    return train.build_trainer(*train.parse_arguments(argv(data_dir, cache, output_dir)))


def token_ids(run: train.Run) -> dict:
    return {
        role: (list(run.datasets[role]["input_ids"]), list(run.datasets[role]["labels"]))
        for role in ("train", "validation")
    }


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """(data folder, the cache the first run left, that run's token ids, tokenizer, and cache entries by name)."""
    folder = tmp_path_factory.mktemp("caches")
    pairs = reverse_pairs(200, seed=3)
    (folder / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    run = prepared(folder, folder / "cache", folder / "first")
    text_file, split_file = (Path(f["filename"]) for f in run.text["train"].cache_files)
    entries = {
        "the text of the data file": text_file,
        "its dataset_info.json": text_file.parent / "dataset_info.json",
        "the --validation_size split": split_file,
        "the token ids": Path(run.datasets["train"].cache_files[0]["filename"]),
        "the kept pairs' indices": Path(run.datasets["train"].cache_files[1]["filename"]),
        "the tokenizer": next((folder / "cache" / "vanilla_transformer_tokenizers").glob("*/tokenizer.json")),
    }
    return folder, token_ids(run), run.tokenizer.backend_tokenizer.to_str(), entries


def damaged_copy(first_run, tmp_path, entry: str, how: str) -> tuple[Path, Path]:
    folder, _, _, entries = first_run
    cache = tmp_path / "cache"
    shutil.copytree(folder / "cache", cache)
    path = cache / entries[entry].relative_to(folder / "cache")
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    return cache, path


@pytest.mark.parametrize(
    "entry",
    [
        "the text of the data file",
        "its dataset_info.json",
        "the --validation_size split",
        "the token ids",
        "the kept pairs' indices",
        "the tokenizer",
    ],
)
def test_a_truncated_cache_entry_is_rebuilt_with_a_warning_naming_it(first_run, tmp_path, caplog, entry):
    folder, ids, tokenizer, _ = first_run
    cache, path = damaged_copy(first_run, tmp_path, entry, "truncated")
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.caches"):
        run = prepared(folder, cache, tmp_path / "second")
    warnings = [record.message for record in caplog.records if record.name == "vanilla_transformer.training.caches"]
    assert len(warnings) == 1 and "is damaged" in warnings[0], warnings
    # The entry named is the damaged file, or the prepared dataset (folder) that holds it.
    named = warnings[0].split(" is damaged")[0].split()[-1]
    assert Path(named) == path or Path(named) in path.parents
    assert path.name in warnings[0] or Path(named) == path
    assert token_ids(run) == ids and run.tokenizer.backend_tokenizer.to_str() == tokenizer
    assert not caches.damaged_entries(cache)


@pytest.mark.parametrize("entry", ["the text of the data file", "the tokenizer"])
def test_a_deleted_cache_file_is_rebuilt(first_run, tmp_path, entry):
    """A dataset folder without its Arrow file (or a tokenizer folder without tokenizer.json) would fail to open:
    it is rebuilt as well."""
    folder, ids, tokenizer, _ = first_run
    cache, path = damaged_copy(first_run, tmp_path, entry, "deleted")
    run = prepared(folder, cache, tmp_path / "second")
    assert token_ids(run) == ids and run.tokenizer.backend_tokenizer.to_str() == tokenizer
    assert path.is_file()


def test_a_cache_that_cannot_be_rebuilt_stops_the_run_naming_it_and_the_remedy(first_run, tmp_path, monkeypatch):
    folder = first_run[0]
    cache, path = damaged_copy(first_run, tmp_path, "the token ids", "truncated")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(DamagedFileError) as error:
        prepared(folder, cache, tmp_path / "second")
    message = str(error.value)
    assert f"{path} is truncated or corrupt (Expected to be able to read" in message
    assert f"The datasets cache {path.parent}" in message and "Permission denied" in message
    assert "Delete it (the next run rebuilds it from the data), or give another --cache_dir." in message


def test_an_error_that_is_not_a_damaged_cache_passes_unchanged(tmp_path):
    (tmp_path / "cache").mkdir()

    def failing():
        raise ValueError("a mistake in the data")

    with pytest.raises(ValueError, match="^a mistake in the data$"):
        caches.rebuilt_if_damaged(failing, tmp_path / "cache")


def test_a_file_another_run_is_writing_is_never_taken_for_a_damaged_one(tmp_path):
    """A failed build scans the cache for damaged entries; datasets writes a new one under a folder ending in
    .incomplete, whose half-written Arrow file a scan once deleted under a run still writing it."""
    writing = tmp_path / "cache" / "generator" / "default-0123" / "0.0.0" / "abc.incomplete"
    writing.mkdir(parents=True)
    (writing / "generator-train.arrow").write_bytes(b"ARROW1\x00\x00half")
    assert caches.arrow_problem(writing / "generator-train.arrow")  # the reference: read alone, it is damaged

    def failing():
        raise ValueError("a mistake in the data")

    with pytest.raises(ValueError, match="^a mistake in the data$"):
        caches.rebuilt_if_damaged(failing, tmp_path / "cache")
    assert (writing / "generator-train.arrow").is_file()


def test_an_entry_another_run_removes_during_the_scan_is_passed_over(first_run, tmp_path, monkeypatch):
    """A failed build scans the whole cache folder, which other runs may share: an entry listed and then replaced
    or removed by one of them (a folder renamed, a file deleted) is neither reported nor an error, while a damaged
    one beside it still is. The reference: the entries on disk when the scan ends."""
    cache, truncated = damaged_copy(first_run, tmp_path, "the token ids", "truncated")
    folder, _, _, entries = first_run
    text = cache / entries["the text of the data file"].relative_to(folder / "cache")
    kept = cache / entries["the kept pairs' indices"].relative_to(folder / "cache")
    check_dataset, check_arrow = caches.dataset_problem, caches.arrow_problem

    def dataset_gone_meanwhile(dataset):
        (dataset / caches.DATASET_INFO).unlink()  # another run replacing it
        return check_dataset(dataset)

    def file_gone_meanwhile(path):
        if path == kept:
            path.unlink()
        return check_arrow(path)

    monkeypatch.setattr(caches, "dataset_problem", dataset_gone_meanwhile)
    monkeypatch.setattr(caches, "arrow_problem", file_gone_meanwhile)
    damaged = caches.damaged_entries(cache)
    assert not (text.parent / caches.DATASET_INFO).exists() and not kept.exists()
    assert list(damaged) == [truncated]
    caches._remove(kept, "gone meanwhile", cache)  # deleting what is gone is no error


def test_an_entry_whose_file_another_run_removes_while_it_is_deleted_is_deleted_whole(tmp_path, monkeypatch):
    """shutil.rmtree stops at the first file it finds gone (another run's rebuild removing it at that moment),
    leaving the rest; the deletion goes on until the entry is gone."""
    entry = tmp_path / "cache" / "entry"
    entry.mkdir(parents=True)
    for name in ("a.arrow", "b.arrow", "dataset_info.json"):
        (entry / name).write_text("x")
    rmtree, calls = shutil.rmtree, []

    def cut_short(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            (Path(path) / "a.arrow").unlink()  # what the other run did, as rmtree reached that file
            raise FileNotFoundError(2, "No such file or directory", str(Path(path) / "a.arrow"))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(caches.shutil, "rmtree", cut_short)
    caches._remove(entry, "damaged", tmp_path / "cache")
    assert not entry.exists() and len(calls) == 2
