"""The ``vanilla-transformer`` command: one entry point, a subcommand per tool.

    vanilla-transformer train multi30k --dataset_name none --train_source_file train.en ... --output_dir run
    vanilla-transformer translate --model run --input test.en --output hyp.de
    vanilla-transformer average --checkpoint-root run --last 5 --output-dir run/averaged
    vanilla-transformer tokenizer train.en train.de --vocab-size 8000 --output-dir tokenizer
    vanilla-transformer convert from-marian Helsinki-NLP/opus-mt-en-de converted
    vanilla-transformer publish run --repo-id you/en-de
    vanilla-transformer table3 multi30k --max-steps 20000 --seeds 3 --output-dir runs/table3
    accelerate launch --config_file $(vanilla-transformer config ddp) -m vanilla_transformer.cli train ...

Recipes (``train RECIPE``) and accelerate configs (``config NAME``) ship inside the package and are
named, not located. Every flag takes both spellings (``--num_beams``, ``--num-beams``). Bad input
ends in one line naming the flag and the fix, exit status 2; from Python the same calls raise. The
installed command starts in `vanilla_transformer_command` (installed beside the package), which answers
``--version``, ``recipe`` and ``config`` and prints the help screens rendered with the package
(`help_screens`) without importing torch; the packaged files are found by `vanilla_transformer.command_line`
for both. The library never imports this module: it runs the tools, they do not run it.
"""

from __future__ import annotations

import importlib
import sys

from .command_line import (  # noqa: F401 (imported from here)
    HELP_COLUMNS,
    PROG,
    MissingExtra,
    accelerate_config_names,
    accelerate_config_path,
    did_you_mean,
    exit_with_usage_error,
    help_rendered_with,
    option_strings,
    packaged,
    packaged_text,
    packaged_usage,
    recipe_names,
    recipe_path,
    subcommand_parsers,
    version_text,
    with_dashes,
)

# name -> (module with main(argv) and build_parser(prog), what it does)
TOOLS = {
    "train": (
        "vanilla_transformer.training.run",
        "train or fine-tune with the paper's recipe (a packaged recipe by name), evaluate, translate a test set",
    ),
    "translate": (
        "vanilla_transformer.training.translation",
        "translate a file or standard input with beam search; score against references",
    ),
    "average": ("vanilla_transformer.training.averaging", "average the weights of a run's last checkpoints (§6.1)"),
    "tokenizer": (
        "vanilla_transformer.tokenization_vanilla_transformer",
        "train the joint byte-level BPE vocabulary (§5.1) on text files",
    ),
    "convert": ("vanilla_transformer.convert", "import a MarianMT checkpoint exactly; export to CTranslate2"),
    "publish": (
        "vanilla_transformer.publish",
        "upload a model folder to the Hub: the model's files only, never checkpoints or training state",
    ),
    "table3": (
        "vanilla_transformer.training.table3",
        "train and score the base model and every variation of the paper's Table 3 on a recipe",
    ),
}
PATHS = {
    "recipe": "print the path of a packaged recipe (without a name: list them)",
    "config": "print the path of a packaged accelerate config (single, ddp, fsdp; without a name: list them)",
}


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def usage() -> str:
    width = max(map(len, [*TOOLS, *PATHS]))
    lines = [f"usage: {PROG} COMMAND [ARGS ...]   ({PROG} COMMAND --help for its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in TOOLS.items()]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in PATHS.items()]
    lines += ["", __doc__.split("\n\n")[1]]
    return "\n".join(lines)


def tool_module(name: str, prog: str):
    """The module of tool ``name``; without its extra (`train`, `translate`, `average`, `table3` need
    ``[train]``), one line naming the ``pip install`` and exit status 2."""
    try:
        return importlib.import_module(TOOLS[name][0])
    except MissingExtra as error:
        exit_with_usage_error(prog, error)


def run_command(name: str, argv: list[str], prog: str | None = None):
    """Run tool ``name`` on ``argv`` as the command line does: bad input ends in one line, exit status 2."""
    prog = prog or f"{PROG} {name}"
    module = tool_module(name, prog)
    if name == "train":  # its parser takes both spellings itself, and only its checks are bad input
        return module.main(argv, prog=prog, exit_on_bad_input=True)
    parser = module.build_parser(prog)
    try:
        return module.main(with_dashes(argv, parser), prog=prog)
    except (ValueError, OSError) as error:
        exit_with_usage_error(prog, error)


def print_path(kind: str, argv: list[str]) -> None:
    """What ``recipe [NAME]`` and ``config [NAME]`` print (the console script prints it itself), or their errors."""
    if argv in (["-h"], ["--help"]):
        sys.stdout.write(packaged_usage(kind))
        return
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        exit_with_usage_error(f"{PROG} {kind}", f"give one name ({', '.join(packaged(kind))}), got {' '.join(argv)}")
    try:
        sys.stdout.write(packaged_text(kind, *argv))
    except ValueError as error:
        exit_with_usage_error(f"{PROG} {kind}", error)


def help_text(argv: list[str]) -> str | None:
    """What `main` prints for ``--help`` (of the command, or of a tool), rendered by the parsers themselves at
    the terminal's width; None when ``argv`` asks for no help screen. `vanilla_transformer_command` prints the
    packaged screens (`help_screens`) instead where the installed versions are those they were rendered with."""
    if argv in ([], ["-h"], ["--help"]):
        return usage() + "\n"
    if len(argv) == 2 and argv[0] in PATHS and argv[1] in {"-h", "--help"}:
        return packaged_usage(argv[0])
    if len(argv) == 2 and argv[0] in TOOLS and argv[1] in {"-h", "--help"}:
        return tool_module(argv[0], f"{PROG} {argv[0]}").build_parser(f"{PROG} {argv[0]}").format_help()
    return None


def rendered_screens() -> dict[str, list[str]]:
    """Each tool's ``--help`` screens (its own, then its subcommands') as the parsers print them at
    `HELP_COLUMNS` columns: the one rendering behind docs/cli.md and the packaged help_screens.json."""
    import os

    width, os.environ["COLUMNS"] = os.environ.get("COLUMNS"), str(HELP_COLUMNS)  # argparse wraps at COLUMNS
    try:
        screens = {}
        for name, (module, _) in TOOLS.items():
            parser = importlib.import_module(module).build_parser(f"{PROG} {name}")
            screens[name] = [each.format_help() for each in [parser, *subcommand_parsers(parser)]]
        return screens
    finally:
        os.environ.pop("COLUMNS") if width is None else os.environ.update(COLUMNS=width)


def help_screens() -> str:
    """vanilla_transformer/help_screens.json: the screens the console script prints for ``--help`` and
    ``TOOL --help``, and the versions they were rendered with (`help_rendered_with`)."""
    import json

    screens = {"": usage() + "\n", **{name: texts[0] for name, texts in rendered_screens().items()}}
    return (
        json.dumps(
            {"rendered_with": help_rendered_with(), "columns": HELP_COLUMNS, "screens": screens},
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )


def reference() -> str:
    """docs/cli.md: every command's ``--help``, as the parsers print it at a fixed width (`HELP_COLUMNS`)."""
    from transformers import __version__ as transformers_version

    sections = [
        "# Command-line reference",
        "",
        (
            f"Generated from the parsers by `vanilla_transformer.cli.reference()` with transformers "
            f"{transformers_version} (the Trainer's flags are that version's); `{PROG} COMMAND --help` prints the "
            "same (with these versions installed, from screens rendered with the package, without importing "
            "torch). Every flag takes both spellings (`--num_beams`, `--num-beams`)."
        ),
        "",
        "```text",
        usage(),
        "```",
    ]
    for name, texts in rendered_screens().items():
        summary = TOOLS[name][1]
        sections += [
            "",
            f"## {PROG} {name}",
            "",
            summary[0].upper() + summary[1:] + ".",
            "",
            "```text",
            "".join(text + "\n" for text in texts).rstrip(),
            "```",
        ]
    for name, summary in PATHS.items():
        sections += ["", f"## {PROG} {name}", "", summary[0].upper() + summary[1:] + ".", ""]
        sections += ["```text", packaged_usage(name).rstrip(), "```"]
    return "\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> None:
    """The command (the console script starts in `vanilla_transformer_command`, which answers ``--help`` from the
    packaged screens); returns nothing (a value would become the exit status); use `run_command` for results."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(usage())
    elif argv[0] == "--version":
        sys.stdout.write(version_text())
    elif argv[0] in PATHS:
        print_path(argv[0], argv[1:])
    elif argv[0] in TOOLS:
        run_command(argv[0], argv[1:])
    else:
        exit_with_usage_error(
            PROG,
            f"no command {argv[0]!r}{did_you_mean(argv[0], [*TOOLS, *PATHS])}; "
            f"the commands are {', '.join([*TOOLS, *PATHS])} (see {PROG} --help)",
        )


if __name__ == "__main__":  # accelerate launch -m vanilla_transformer.cli train ...
    main()
