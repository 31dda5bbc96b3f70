"""The caches a run keeps for the next one, checked when opened: a damaged entry is rebuilt, never read.

`data` keeps, under ``--cache_dir`` (default: the datasets cache), the Arrow files of `datasets` (each
data file's text, its token ids, the split of ``--validation_size``) and the tokenizer trained on the
data. A full disk, an interrupted copy or a file truncated between two runs leaves an entry that
fails when it is next opened, with pyarrow's raw "Expected to be able to read N bytes for message
body", which names neither the file nor what to do. Every entry is derived from the data, so:

- `rebuilt_if_damaged` runs a step that opens Arrow caches (``Dataset.from_generator``, ``map``,
  ``train_test_split``); if it fails and entries of its cache folder are damaged (an Arrow file that
  does not read to its end, a dataset whose ``dataset_info.json`` is not JSON or whose split files are
  missing or short of rows), it deletes them, each named in a warning, and runs the step again, which
  rebuilds them. A cache it cannot repair stops the run with `DamagedFileError` naming the folder and
  how to rebuild it (delete it, or give another ``--cache_dir``).
- `usable_tokenizer_cache` does the same for a cached tokenizer (its JSON files complete and parseable).

What is checked is the structure (each Arrow message readable, row counts, JSON syntax), the damage a
cut-short write leaves; bytes overwritten in place inside a complete file are not detected.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..checkpoint_files import DamagedFileError

logger = logging.getLogger(__name__)

T = TypeVar("T")
REBUILD = "Delete it (the next run rebuilds it from the data), or give another --cache_dir."
DATASET_INFO = "dataset_info.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def arrow_problem(path: Path) -> str | None:
    """Why the Arrow stream file ``path`` (what `datasets` writes) does not read to its end; None if it does."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            for _ in pa.ipc.open_stream(source):  # each message's header and body must be there (no copy)
                pass
    except (OSError, pa.ArrowException) as error:
        return str(error) or type(error).__name__
    return None


def arrow_rows(path: Path) -> int:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))


def dataset_problem(folder: Path) -> str | None:
    """Why the dataset `datasets` prepared in ``folder`` (its ``dataset_info.json`` and split files) cannot be read."""
    try:
        info = json.loads((folder / DATASET_INFO).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        return f"{DATASET_INFO} is not valid JSON: {error}"
    for split, split_info in (info.get("splits") or {}).items():
        files = sorted(folder.glob(f"*-{split}.arrow")) + sorted(folder.glob(f"*-{split}-*-of-*.arrow"))
        if not files:
            return f"the Arrow file of its {split!r} split is missing"
        for path in files:
            if problem := arrow_problem(path):
                return f"{path.name}: {problem}"
        rows, expected = sum(arrow_rows(path) for path in files), split_info.get("num_examples")
        if expected is not None and rows != expected:
            return f"its {split!r} split holds {rows} rows where {DATASET_INFO} says {expected}"
    return None


def damaged_entries(folder: Path) -> dict[Path, str]:
    """The damaged entries under ``folder`` and what is wrong with each: a prepared dataset (its folder)
    or a cached ``map``/``train_test_split`` result (its Arrow file). The folder may be shared with runs
    at work: what they are writing (``*.incomplete``) is passed over, and so is an entry gone meanwhile."""
    damaged: dict[Path, str] = {}
    prepared, arrow_files = [], []
    for root, folders, files in os.walk(folder):  # a folder gone mid-walk is skipped (os.walk ignores errors)
        folders[:] = sorted(name for name in folders if not name.endswith(".incomplete"))  # being written by a run
        if DATASET_INFO in files:
            prepared.append(Path(root))
        arrow_files += [Path(root) / name for name in sorted(files) if name.endswith(".arrow")]
    for dataset in prepared:
        if (problem := _unless_gone(dataset_problem, dataset)) is not None:
            damaged[dataset] = problem
    for path in arrow_files:
        if path.parent in prepared and not path.name.startswith("cache-"):
            continue  # a split file, checked with its dataset
        if any(parent.name.endswith(".incomplete") for parent in path.parents):
            continue  # ``folder`` itself inside one: being written by a run, not ours to judge
        if not any(entry in path.parents for entry in damaged) and (problem := _unless_gone(arrow_problem, path)):
            damaged[path] = problem
    return damaged


def _unless_gone(check: Callable[[Path], str | None], entry: Path) -> str | None:
    """``check(entry)``; None where the entry is gone (another run replaced or removed it since it was listed)."""
    try:
        problem = check(entry)
    except FileNotFoundError:
        return None
    return problem if entry.exists() else None


def _remove(entry: Path, problem: str, folder: Path) -> None:
    logger.warning(f"the cache entry {entry} is damaged ({problem}): deleting it to rebuild it from the data")
    try:
        while entry.exists():  # a file in it removed meanwhile by another run's rebuild stops rmtree: again
            try:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            except FileNotFoundError:
                pass
    except OSError as error:
        raise DamagedFileError(
            f"The datasets cache {folder}: {entry} is truncated or corrupt ({problem}) and could "
            f"not be deleted ({error}). {REBUILD}"
        ) from None


def rebuilt_if_damaged(build: Callable[[], T], folder: str | Path | None) -> T:
    """``build()``, a step that opens Arrow caches under ``folder``. If it fails and entries there are
    damaged, they are deleted (each named in a warning) and ``build()`` runs again, rebuilding them; an
    error that is not a damaged cache's passes unchanged."""
    if folder is None:  # nothing cached on disk
        return build()
    folder = Path(folder)
    try:
        return build()
    except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError, its I/O errors OSErrors
        damaged = damaged_entries(folder)
        if not damaged:
            raise
    for entry, problem in damaged.items():
        _remove(entry, problem, folder)
    try:
        return build()
    except (OSError, ValueError) as error:
        if not (still := damaged_entries(folder)):
            raise
        entry, problem = next(iter(still.items()))
        raise DamagedFileError(
            f"The datasets cache {folder}: {entry} is truncated or corrupt ({problem}) even after "
            f"it was rebuilt. {REBUILD}"
        ) from error


def dataset_cache_folder(dataset) -> Path | None:
    """The folder of an Arrow dataset's cache files, where ``map`` writes its results; None in memory."""
    files = getattr(dataset, "cache_files", None)
    return Path(files[0]["filename"]).parent if files else None


def generator_cache_folder(cache_dir: str | None, fingerprint: str) -> Path:
    """Where ``Dataset.from_generator(..., fingerprint=fingerprint)`` keeps its dataset: its folder under
    ``<cache_dir>/generator`` named with the fingerprint, or that whole folder if none is (yet)."""
    from datasets import config

    root = Path(cache_dir or config.HF_DATASETS_CACHE) / "generator"
    named = sorted(root.glob(f"*{fingerprint}*")) if root.is_dir() else []
    return named[0] if len(named) == 1 else root


def tokenizer_problem(folder: Path) -> str | None:
    """Why the tokenizer saved in ``folder`` cannot be loaded (a file missing, or not JSON); None if it can."""
    for name in TOKENIZER_FILES:
        if not (folder / name).is_file():
            return f"{name} is missing"
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            return f"{path.name} is not valid JSON: {error}"
    return None


def usable_tokenizer_cache(folder: Path) -> bool:
    """Whether a tokenizer cached in ``folder`` can be loaded; a damaged one is deleted (with a warning
    naming it) so that it is trained again."""
    if not folder.exists():
        return False
    if (problem := tokenizer_problem(folder)) is None:
        return True
    logger.warning(f"the cached tokenizer {folder} is damaged ({problem}): deleting it to train it again")
    try:
        shutil.rmtree(folder)
    except OSError as error:
        raise DamagedFileError(
            f"The tokenizer cache {folder} is damaged ({problem}) and could not be deleted ({error}). {REBUILD}"
        ) from None
    return False


__all__ = [
    "DamagedFileError",
    "arrow_problem",
    "damaged_entries",
    "dataset_cache_folder",
    "generator_cache_folder",
    "rebuilt_if_damaged",
    "usable_tokenizer_cache",
]
