"""Shared helpers for the tests."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Prepended to code run by `run_without_package`: any attempt to import the package fails, as in a
# process on a machine where it was never installed.
_BLOCK_PACKAGE = """
import sys
sys.modules["vanilla_transformer"] = None  # `import vanilla_transformer` now raises ImportError
"""


def run_without_package(code: str, cwd, timeout: int = 300) -> str:
    """Run `code` in a fresh Python where `vanilla_transformer` cannot be imported; return stdout.

    Raises AssertionError with the child's stderr when it fails.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_PACKAGE + textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"subprocess failed:\n{result.stderr[-4000:]}"
    return result.stdout


def load_script(relative_path: str):
    """A script of the repository (benchmarks/*.py, training/*.py) as a module, without touching sys.path."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def counted_kernels():
    """Counts the operators that run inside the block, by their profiler names (filled in when it ends)."""
    from torch.profiler import ProfilerActivity, profile

    counts = Counter()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        yield counts
    counts.update({event.key: event.count for event in profiler.key_averages()})


def legacy_tokenizer_file(folder: Path) -> None:
    """Rewrite ``folder``'s tokenizer.json as tokenizers < 0.20 wrote the same tokenizer: merges as "a b"."""
    import json

    written = json.loads((folder / "tokenizer.json").read_text())
    assert all(isinstance(merge, list) for merge in written["model"]["merges"])
    written["model"]["merges"] = [" ".join(merge) for merge in written["model"]["merges"]]
    written["model"].pop("ignore_merges", None)
    (folder / "tokenizer.json").write_text(json.dumps(written))
