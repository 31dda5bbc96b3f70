"""Run a script that knows nothing of this package with the package registered.

    python -m vanilla_transformer run_translation.py --model_name_or_path my-checkpoint ...
    torchrun --nproc_per_node 2 -m vanilla_transformer run_translation.py ...
    python -m vanilla_transformer -m some.module ARGS          # a module instead of a file

A stock script (transformers' examples/pytorch/translation/run_translation.py, your own) that does
not ``import vanilla_transformer`` finds our checkpoints only through their ``auto_map``, so
transformers demands ``trust_remote_code=True`` and then runs the copy of the code saved in the
checkpoint, which may be older than the installed package, and copies that older code on into
every checkpoint the script saves. Started through this runner, the script sees the installed
package registered with the Auto classes: no trust flag is needed, the installed code runs, and the
code copied into the checkpoints it saves is the installed version's.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

import vanilla_transformer  # noqa: F401  (registers the classes with the Auto API)

USAGE = "usage: python -m vanilla_transformer SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(f"{USAGE}\n\n{__doc__.split(chr(10) + chr(10))[0]}")
        return
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(f"-m needs a module name. {USAGE}")
        try:  # as `python -m` says it, not with a traceback
            found = importlib.util.find_spec(argv[1])
        except (ImportError, ValueError):  # a parent package missing, or an empty name
            found = None
        if found is None:
            raise SystemExit(f"No module named {argv[1]!r}. {USAGE}")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = Path(argv[0])
    if not script.is_file():
        raise SystemExit(f"{str(script)!r} is not a file: give the path of a Python script to run. {USAGE}")
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))  # what `python SCRIPT.py` would see, for its own imports
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
