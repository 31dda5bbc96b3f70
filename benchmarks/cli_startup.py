"""How long the command takes to print its help, its version and a launch config's path, against the package.

    python benchmarks/cli_startup.py                  # 7 alternating rounds, medians
    python benchmarks/cli_startup.py --rounds 11 --markdown

Each row is a fresh Python process, run in alternating rounds (so a busy neighbour on a shared machine
slows every row alike), timed by the wall clock and by its CPU time (user + system, from the
children's resource usage). The rows:

- ``train --help`` as the installed command runs it (``vanilla_transformer_command.main``): the screen
  shipped in the package (``help_screens.json``), what a fresh install prints the first time;
- ``python -m vanilla_transformer.cli train --help``: the package and the full parser (what the installed
  command falls back to where the installed versions are not those the packaged screens were rendered with);
- ``--version`` and ``config ddp`` (what ``accelerate launch --config_file $(vanilla-transformer config
  ddp)`` runs first) as the installed command answers them, and as the package's ``cli.main`` does (what
  the command ran for them before 2026-11-26);
- ``import vanilla_transformer`` and ``import torch``: the package's import (what registers it with
  the Auto API) and torch's alone, for scale.

The command's rows must not import torch, transformers or the package: that is checked, not timed.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

from common import argument_parser

COMMAND = "import sys; from vanilla_transformer_command import main; sys.exit(main())"  # the console script
ROWS = {
    "`vanilla-transformer train --help`": ["-c", COMMAND, "train", "--help"],
    "`python -m vanilla_transformer.cli train --help`": ["-m", "vanilla_transformer.cli", "train", "--help"],
    "`vanilla-transformer --version`": ["-c", COMMAND, "--version"],
    "`python -m vanilla_transformer.cli --version`": ["-m", "vanilla_transformer.cli", "--version"],
    "`vanilla-transformer config ddp`": ["-c", COMMAND, "config", "ddp"],
    "`python -m vanilla_transformer.cli config ddp`": ["-m", "vanilla_transformer.cli", "config", "ddp"],
    "`import vanilla_transformer`": ["-c", "import vanilla_transformer"],
    "`import torch`": ["-c", "import torch"],
}
WITHOUT_THE_PACKAGE = [row for row, arguments in ROWS.items() if arguments[1] == COMMAND]


def timed(arguments: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], env=env, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def check_imports_nothing_heavy(row: str, env: dict) -> None:
    code = (
        COMMAND.replace("sys.exit(main())", "main(sys.argv[1:])") + "; print(sorted({'torch', "
        "'transformers', 'vanilla_transformer'} & set(sys.modules)), file=sys.stderr)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, *ROWS[row][2:]], env=env, capture_output=True, text=True, check=True
    )
    if completed.stderr.strip() != "[]":
        raise SystemExit(
            f"{row} imported {completed.stderr.strip()} (for --help: are the installed versions those "
            "vanilla_transformer/help_screens.json was rendered with?)"
        )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds; medians are reported")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args()
    env = {**os.environ, "COLUMNS": "100"}
    for row in WITHOUT_THE_PACKAGE:
        check_imports_nothing_heavy(row, env)
    times: dict[str, list[tuple[float, float]]] = {row: [] for row in ROWS}
    for _ in range(args.rounds):
        for row, arguments in ROWS.items():
            times[row].append(timed(arguments, env))
    header = f"| command | wall s (median of {args.rounds}) | CPU s (median) |"
    print(header if args.markdown else header.replace("|", " ").strip())
    if args.markdown:
        print("| --- | ---: | ---: |")
    for row, samples in times.items():
        wall, cpu = (statistics.median(values) for values in zip(*samples))
        print(f"| {row} | {wall:.2f} | {cpu:.2f} |" if args.markdown else f"{row:<55} {wall:6.2f} {cpu:6.2f}")


if __name__ == "__main__":
    main()
