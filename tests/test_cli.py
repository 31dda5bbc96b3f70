"""The `vanilla-transformer` command (vanilla_transformer.cli): subcommands, packaged files by name, both
spellings of every flag, bad input as one line with exit status 2, `python -m` on each module, the
command-line reference in docs/cli.md, and several processes through `accelerate launch -m`."""

import json
import os
import re
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from helpers import REPO
from test_train import reverse_pairs, tiny_args, write_pairs
from test_translate import save_model
from vanilla_transformer.cli import TOOLS, accelerate_config_path, recipe_path, reference
from vanilla_transformer.cli import main as cli
from vanilla_transformer.command_line import install_command


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("model"))


def python(*arguments, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *map(str, arguments)], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_docs_cli_md_is_the_reference_the_parsers_print():
    """Regenerate (with help_screens.json, from the same rendering) with: python -c "from vanilla_transformer.cli import help_screens, reference; open('docs/cli.md', 'w').write(reference()); open('vanilla_transformer/help_screens.json', 'w').write(help_screens())" """
    import transformers

    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    if f"with transformers {transformers.__version__} " not in written:  # e.g. the lowest supported versions
        pytest.skip(f"docs/cli.md lists another transformers version's Trainer flags than {transformers.__version__}")
    assert written == reference(), "docs/cli.md is out of date"


def test_packaged_files_by_name_and_a_misspelt_name_with_the_closest(capsys):
    assert recipe_path("multi30k") == REPO / "vanilla_transformer/training/recipes/multi30k.yaml"
    assert accelerate_config_path("ddp").read_text() == (REPO / "training/accelerate/ddp.yaml").read_text()
    with pytest.raises(SystemExit) as exit_info:
        cli(["config", "dpp"])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1 and "did you mean 'ddp'" in error
    assert "path" not in error  # `config` takes names only
    with pytest.raises(SystemExit):
        cli(["trian"])
    assert "did you mean 'train'" in capsys.readouterr().err


def test_every_tool_takes_both_spellings(model_dir, tmp_path, monkeypatch):
    """translate's --num_beams/--num-beams and --no_progress reach translate() alike; average's and publish's
    flags too (their parsers spell them with dashes)."""
    import vanilla_transformer.training.translation as translation

    calls = []

    def spy(model, tokenizer, sentences, batch_size, **kwargs):
        calls.append((kwargs.get("num_beams"), kwargs.get("progress")))
        return ["x"] * len(sentences)

    monkeypatch.setattr(translation, "translate", spy)
    source = tmp_path / "in.txt"
    source.write_text("a b c\n")
    for spelling in (["--num_beams", "3", "--no_progress"], ["--num-beams", "3", "--no-progress"]):
        cli(
            [
                "translate",
                "--model",
                str(model_dir),
                "--input",
                str(source),
                "--output",
                str(tmp_path / "out"),
                *spelling,
            ]
        )
    assert calls == [(3, False), (3, False)]
    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(SystemExit):  # parsed (both spellings), then refused for the missing folder, not the flag
        cli(["average", "--checkpoint_root", str(checkpoints), "--last", "2", "--output_dir", str(tmp_path / "avg")])


def test_train_takes_both_spellings_and_refuses_bad_values_in_one_line(tmp_path, capsys):
    from vanilla_transformer.training.options import parse_arguments

    _, _, dashed = parse_arguments(["--max-tokens", "300", "--output-dir", str(tmp_path)])
    _, _, underscored = parse_arguments(["--max_tokens", "300", "--output_dir", str(tmp_path)])
    assert dashed.max_tokens == underscored.max_tokens == 300 and dashed.output_dir == underscored.output_dir
    for argv, message in (
        (["--max_tokens", "many"], "--max_tokens: invalid int value: 'many'"),
        (["--max_tokns", "300"], "--max_tokns is not a flag of vanilla-transformer train (did you mean --max_tokens?)"),
        (["--preset", "huge"], "--preset 'huge' does not exist"),
        (["multi30x"], "no recipe named 'multi30x' (did you mean 'multi30k'?)"),
        (["multi30x"], "Or give the path of a recipe file (.yaml"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli(["train", *argv, "--output_dir", str(tmp_path / "out")])
        error = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and len(error.splitlines()) == 1, error
        assert error.startswith("vanilla-transformer train: error:") and message in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["translate", "--modle", "m"],
            "translate: error: --modle is not a flag of vanilla-transformer translate "
            "(did you mean --model?); see vanilla-transformer translate --help.",
        ),
        (["average", "--checkpoint-rot", "c"], "(did you mean --checkpoint-root?)"),
        (
            ["publish", "run", "--repo_id=a/b", "--privat"],
            "--privat is not a flag of vanilla-transformer publish (did you mean --private?)",
        ),
        (["convert", "to-ctranslate2", "m", "out", "--quantisation", "int8"], "(did you mean --quantization?)"),
        (["translate", "--mod", "m"], "--mod is not a flag"),  # no abbreviations: a new flag would make them ambiguous
    ],
)
def test_every_command_names_a_misspelt_flag_before_asking_for_what_it_meant(argv, message, capsys):
    """translate, average, publish and convert said argparse's "unrecognized arguments" after a screen of usage, or
    that the flag the typo meant was required."""
    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1 and message in error, error


def test_a_value_that_starts_with_dashes_and_a_help_request_are_not_taken_for_misspelt_flags(capsys):
    from vanilla_transformer.publish import build_parser

    args = build_parser().parse_args(["run", "--repo-id", "a/b", "--commit-message", "--- draft, see notes"])
    assert args.commit_message == "--- draft, see notes"  # argparse takes a token with a space for a value
    with pytest.raises(SystemExit) as exit_info:  # but a flag's name has none: --name=value with spaces is a flag
        build_parser().parse_args(["run", "--repo-id", "a/b", "--comit-message=fix a typo"])
    assert exit_info.value.code == 2 and "(did you mean --commit-message?)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli(["translate", "--help", "--modle"])
    assert exit_info.value.code == 0 and "--model" in capsys.readouterr().out


def test_per_device_train_batch_size_shows_no_default_that_max_tokens_overrides(capsys):
    with pytest.raises(SystemExit):
        cli(["train", "--help"])
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  --per_device_train_batch_size N"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("  --"))
    described = " ".join(" ".join(lines[start:end]).split())
    assert "default: 8" not in described and "--max_tokens 0" in described, described


@pytest.mark.parametrize(
    "module",
    [
        "vanilla_transformer.training.run",
        *(  # a process each, importing torch
            pytest.param(module, marks=pytest.mark.slow)
            for module in (
                "vanilla_transformer.training.translation",
                "vanilla_transformer.training.averaging",
                "vanilla_transformer.convert",
                "vanilla_transformer.publish",
                "vanilla_transformer.tokenization_vanilla_transformer",
                "vanilla_transformer.cli",
            )
        ),
    ],
)
def test_python_dash_m_on_each_module_prints_its_help(module):
    completed = python("-m", module, *(["train"] if module.endswith(".cli") else []), "--help")
    assert completed.returncode == 0, completed.stderr[-2000:]
    name = {
        "run": "train",
        "translation": "translate",
        "averaging": "average",
        "convert": "convert",
        "cli": "train",
        "publish": "publish",
        "tokenization_vanilla_transformer": "tokenizer",
    }[module.rsplit(".", 1)[-1]]
    assert name in TOOLS and completed.stdout.startswith(f"usage: vanilla-transformer {name}"), completed.stdout[:300]


@pytest.mark.slow
def test_accelerate_launch_dash_m_trains_on_two_processes_with_the_packaged_config(tmp_path):
    """`accelerate launch --config_file $(vanilla-transformer config ddp) -m vanilla_transformer.cli train ...` on
    2 gloo processes (--use_cpu): both take part and the model is saved once."""
    data = tmp_path / "data"
    data.mkdir()
    write_pairs(data, "train", reverse_pairs(200, seed=1))
    config = python("-m", "vanilla_transformer.cli", "config", "ddp").stdout.strip()
    output = tmp_path / "run"
    completed = python(
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        config,
        "--num_processes",
        "2",
        "--main_process_port",
        "29571",
        "-m",
        "vanilla_transformer.cli",
        "train",
        *tiny_args(data, output, "--max_steps", "2", "--max_tokens", "150", "--warmup_steps", "2"),
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "process 1 of 2" in completed.stderr and (output / "model.safetensors").is_file()
    assert "| processes | 2 |" in (output / "README.md").read_text()  # an update's size needs the count


@pytest.mark.skipif(torch.cuda.is_available(), reason="with GPUs the processes train together")
def test_two_launched_processes_that_would_each_train_alone_are_refused_naming_use_cpu(tmp_path):
    """torchrun (or accelerate launch --multi_gpu) on a machine without GPUs, without --use_cpu: each process
    trained the whole run alone into one folder, the one that lost the lock race was refused naming its sibling
    as "another run", the launcher then stopped the other, which said the model was saved where it was not."""
    data = tmp_path / "data"
    data.mkdir()
    write_pairs(data, "train", reverse_pairs(200, seed=1))
    output = tmp_path / "run"
    arguments = [word for word in tiny_args(data, output, "--max_steps", "2") if word != "--use_cpu"]
    completed = python(
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29573",
        "-m",
        "vanilla_transformer.cli",
        "train",
        *arguments,
        timeout=300,
    )
    assert completed.returncode != 0
    said = "this process was started as one of 2 (WORLD_SIZE=2, by accelerate launch or torchrun) but would train alone"
    assert completed.stderr.count(said) == 2 and "--use_cpu true" in completed.stderr, completed.stderr[-3000:]
    assert "in use by another run" not in completed.stderr and not output.exists()


# ---------------------------------------------------------------------------------------------
# Help screens shipped in the package (vanilla_transformer_command, the console script)
# ---------------------------------------------------------------------------------------------

HELP_REQUESTS = [["--help"], *([tool, "--help"] for tool in TOOLS)]


def printed_by(function, argv, capsys) -> str:
    """What ``function(argv)`` prints on stdout; argparse's --help ends in SystemExit(0)."""
    try:
        function(argv)
    except SystemExit as exit_info:
        assert exit_info.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


def packaged_screens() -> dict:
    """help_screens.json as shipped; skips where the installed versions are not those it was rendered with."""
    from vanilla_transformer.command_line import HELP_SCREENS, help_rendered_with

    packaged = json.loads(HELP_SCREENS.read_text(encoding="utf-8"))
    if packaged["rendered_with"] != help_rendered_with():  # e.g. the lowest supported versions
        pytest.skip(f"help_screens.json was rendered with {packaged['rendered_with']}, not {help_rendered_with()}")
    return packaged


def test_packaged_help_screens_are_what_the_parsers_print(capsys, monkeypatch):
    """Regenerated with docs/cli.md (test_docs_cli_md_is_the_reference_the_parsers_print says how). Against
    `cli.main`'s --help (argparse's own help action, through each tool's main) at the same width, and printed
    by the console script from the package data without rendering anything."""
    import vanilla_transformer_command as command
    from vanilla_transformer.cli import help_screens

    packaged = packaged_screens()
    assert (REPO / "vanilla_transformer" / "help_screens.json").read_text(encoding="utf-8") == help_screens(), (
        "vanilla_transformer/help_screens.json is out of date"
    )
    monkeypatch.setenv("COLUMNS", str(packaged["columns"]))
    monkeypatch.setattr("vanilla_transformer.cli.help_text", lambda argv: pytest.fail(f"{argv} rendered"))
    for argv in HELP_REQUESTS:
        screen = packaged["screens"]["" if argv == ["--help"] else argv[0]]
        assert printed_by(command.main, argv, capsys) == screen == printed_by(cli, argv, capsys), argv
    assert (
        printed_by(command.main, [], capsys) == printed_by(command.main, ["-h"], capsys) == printed_by(cli, [], capsys)
    )
    headings = [
        line
        for line in printed_by(command.main, ["train", "-h"], capsys).splitlines()
        if line.endswith(":") and not line.startswith(" ")
    ]
    assert headings[1:6] == ["data:", "model:", "training:", "evaluation and decoding:", "Seq2SeqTrainingArguments:"]


def test_docs_cli_md_holds_the_packaged_help_screens():
    """docs/cli.md and help_screens.json come from one rendering (`cli.rendered_screens`), regenerated together."""
    packaged = json.loads((REPO / "vanilla_transformer" / "help_screens.json").read_text(encoding="utf-8"))
    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert f"with transformers {packaged['rendered_with']['transformers']} " in written
    assert f"```text\n{packaged['screens']['']}" in written
    for tool in TOOLS:
        assert f"## vanilla-transformer {tool}\n" in written and f"```text\n{packaged['screens'][tool]}" in written, (
            tool
        )


def test_help_from_the_package_data_imports_neither_torch_nor_transformers_nor_the_package():
    packaged = packaged_screens()
    completed = python(
        "-c",
        "import sys, vanilla_transformer_command as command; command.main(['train', '--help']); "
        "print(sorted({'torch', 'transformers', 'vanilla_transformer'} & set(sys.modules)), "
        "file=sys.stderr)",
        timeout=60,
    )
    assert completed.returncode == 0 and completed.stderr.strip() == "[]", completed.stderr[-2000:]
    assert completed.stdout == packaged["screens"]["train"]


@pytest.mark.parametrize("damage", ["another transformers", "another Python", "no file", "not JSON"])
def test_help_is_rendered_by_the_parsers_where_the_package_data_does_not_fit(damage, tmp_path, capsys, monkeypatch):
    """Other installed versions (or no readable screens): the parsers render the screen, at the terminal's width."""
    import vanilla_transformer.cli as cli_module
    import vanilla_transformer_command as command
    from vanilla_transformer import command_line

    recorded = json.loads(command_line.HELP_SCREENS.read_text(encoding="utf-8"))
    recorded["rendered_with"] = {
        **command_line.help_rendered_with(),
        **{"another transformers": {"transformers": "4.0.0"}, "another Python": {"python": "3.99"}}.get(damage, {}),
    }
    for each in recorded["screens"]:
        recorded["screens"][each] = "stale\n"  # printed only if the versions are wrongly taken to match
    changed = tmp_path / "help_screens.json"
    if damage != "no file":
        changed.write_bytes(b"\x00\xff{" if damage == "not JSON" else json.dumps(recorded).encode())
    monkeypatch.setattr(command_line, "HELP_SCREENS", changed)
    monkeypatch.setenv("COLUMNS", "60")
    rendered = []
    real = cli_module.help_text
    monkeypatch.setattr(cli_module, "help_text", lambda argv: rendered.append(argv) or real(argv))
    assert printed_by(command.main, ["average", "--help"], capsys) == printed_by(cli, ["average", "--help"], capsys)
    assert rendered == [["average", "--help"]]


def test_help_of_a_command_that_does_not_exist_is_the_commands_error(capsys):
    import vanilla_transformer_command as command

    with pytest.raises(SystemExit) as exit_info:
        command.main(["trian", "--help"])
    assert exit_info.value.code == 2 and "did you mean 'train'" in capsys.readouterr().err


def test_ctrl_c_while_the_package_is_imported_ends_in_one_line_not_a_traceback():
    """The first seconds of any command import torch and transformers; a Ctrl-C then ended in a KeyboardInterrupt
    traceback from deep in an import."""
    # "ready" is printed inside main's guard (its call of `answer`), so the Ctrl-C cannot come before it
    script = (
        "import sys, vanilla_transformer_command as command; real = command.answer; "
        "command.answer = lambda argv: (print('ready', flush=True), real(argv)); command.main(sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, "translate"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)  # while `import vanilla_transformer` runs (seconds: torch)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == ["vanilla-transformer: stopped by Ctrl-C"], err[-2000:]


# ---------------------------------------------------------------------------------------------
# --version, recipe [NAME], config [NAME] without the package (vanilla_transformer_command)
# ---------------------------------------------------------------------------------------------

QUICK_REQUESTS = [
    ["--version"],
    ["recipe"],
    ["recipe", "multi30k"],
    ["config"],
    ["config", "ddp"],
    ["config", "fsdp.yaml"],
]


def expected_answer(argv: list[str]) -> str:
    """What the command prints, from the distribution's metadata and the source tree's files themselves."""
    if argv == ["--version"]:
        return f"vanilla-transformer {metadata.version('vanilla-transformer')}\n"
    folder = REPO / "vanilla_transformer" / "training" / {"recipe": "recipes", "config": "accelerate_configs"}[argv[0]]
    if len(argv) == 2:
        return f"{folder / argv[1].removesuffix('.yaml')}.yaml\n"
    names = sorted(path.stem for path in folder.glob("*.yaml"))
    return "".join(f"{name}\t{folder / name}.yaml\n" for name in names)


@pytest.mark.parametrize("argv", QUICK_REQUESTS, ids=" ".join)
def test_version_and_packaged_paths_are_answered_without_importing_torch_transformers_or_the_package(argv, capsys):
    """The console script's answer in a fresh process, against `cli.main`'s (the package, in this process) and
    against the files and metadata themselves."""
    completed = python(
        "-c",
        "import sys, vanilla_transformer_command as command; command.main(sys.argv[1:]); "
        "print(sorted({'torch', 'transformers', 'vanilla_transformer'} & set(sys.modules)), "
        "file=sys.stderr)",
        *argv,
        timeout=60,
    )
    assert completed.returncode == 0 and completed.stderr.strip() == "[]", completed.stderr[-2000:]
    assert completed.stdout == printed_by(cli, argv, capsys) == expected_answer(argv)


def test_a_listed_path_is_the_one_its_name_gives_and_lists_every_packaged_file(capsys):
    for kind, source in (("recipe", "recipes"), ("config", "accelerate")):
        listed = dict(line.split("\t") for line in printed_by(cli, [kind], capsys).splitlines())
        assert set(listed) == {path.stem for path in (REPO / "training" / source).glob("*.yaml")}
        for name, path in listed.items():
            assert printed_by(cli, [kind, name], capsys) == path + "\n"
            assert Path(path).read_text() == (REPO / "training" / source / f"{name}.yaml").read_text()


@pytest.mark.parametrize("argv", [["recipe", "--help"], ["config", "-h"]], ids=" ".join)
def test_help_of_recipe_and_config_names_the_usage_and_every_packaged_file(argv, capsys):
    """``--help`` on the two path commands answers (exit 0) in a fresh process without the package, and the
    same from the package; it lists the names the folder holds."""
    completed = python(
        "-c",
        "import sys, vanilla_transformer_command as command; command.main(sys.argv[1:]); "
        "print(sorted({'torch', 'transformers', 'vanilla_transformer'} & set(sys.modules)), file=sys.stderr)",
        *argv,
        timeout=60,
    )
    assert completed.returncode == 0 and completed.stderr.strip() == "[]", completed.stderr[-2000:]
    assert completed.stdout == printed_by(cli, argv, capsys)
    folder = REPO / "vanilla_transformer" / "training" / {"recipe": "recipes", "config": "accelerate_configs"}[argv[0]]
    names = sorted(path.stem for path in folder.glob("*.yaml"))
    assert completed.stdout.startswith(f"usage: vanilla-transformer {argv[0]} [NAME]\n")
    assert completed.stdout.endswith(f"names: {', '.join(names)}\n")


def without_the_training_package(monkeypatch) -> None:
    """``vanilla_transformer.training`` and its modules out of sys.modules, to be imported afresh, and put back
    afterwards with the package's attribute (a fresh import sets it). Not ``training_kernels``, which the model
    imported: a second copy of it would leave the first one's classes in the model and patches on the other."""
    import vanilla_transformer

    monkeypatch.setattr(vanilla_transformer, "training", vanilla_transformer.training)
    for name in list(sys.modules):
        if name == "vanilla_transformer.training" or name.startswith("vanilla_transformer.training."):
            monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize(
    "argv, blocked",
    [(["translate", "--help"], "accelerate"), (["average", "x"], "sacrebleu"), (["train", "multi30k"], "datasets")],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_a_tool_without_the_train_extra_names_the_pip_install_in_one_line(argv, blocked, monkeypatch, capsys):
    """A base install (no ``[train]``) asked for a training tool: one line naming what is missing and the
    extra, exit status 2; from Python, importing the training package raises `MissingExtra` with the same.
    (In this process: the training package is taken out of sys.modules and the module blocked, both put back.)"""
    import importlib

    import vanilla_transformer_command as command
    from vanilla_transformer.command_line import MissingExtra

    without_the_training_package(monkeypatch)
    monkeypatch.setitem(sys.modules, blocked, None)  # `import` and find_spec now fail, as without the package
    monkeypatch.setattr(command, "help_request", lambda argv: None)  # the package's answer, not a packaged screen
    message = (
        f"vanilla_transformer.training needs the 'train' extra, and {blocked} is not installed: "
        f"{install_command('train')}"
    )
    with pytest.raises(SystemExit) as exit_info:
        command.main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    assert captured.err == f"vanilla-transformer {argv[0]}: error: {message}\n"
    with pytest.raises(MissingExtra) as error:
        importlib.import_module("vanilla_transformer.training")
    assert str(error.value) == message


def test_without_evaluate_the_training_tools_load_and_scoring_names_the_extra(monkeypatch):
    """evaluate is imported only to score: its absence stops scoring, with the extra named, not the package."""
    import importlib

    from vanilla_transformer.command_line import MissingExtra

    without_the_training_package(monkeypatch)
    monkeypatch.setitem(sys.modules, "evaluate", None)
    metrics = importlib.import_module("vanilla_transformer.training.metrics")
    with pytest.raises(MissingExtra, match="Scoring .* needs the 'train' extra, and evaluate is not installed"):
        metrics.load_translation_metric()


def test_version_without_an_installed_distribution_is_a_one_line_error(monkeypatch, capsys):
    """A clone run without `pip install` has no metadata to read the version from: say so and how to fix it."""
    import vanilla_transformer_command as command

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    for main in (command.main, cli):
        with pytest.raises(SystemExit) as exit_info:
            main(["--version"])
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and error.count("\n") == 1
        assert "not installed" in error and "pip install -e ." in error


@pytest.mark.parametrize(
    "argv",
    [["config", "dpp"], ["recipe", "multi30x"], ["config", "ddp", "fsdp"], ["recipe", "--name"], ["config", "-h", "x"]],
    ids=" ".join,
)
def test_an_unknown_name_or_more_arguments_get_the_packages_error_and_exit_status(argv, capsys):
    import vanilla_transformer_command as command

    errors = []
    for main in (command.main, cli):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        captured = capsys.readouterr()
        errors.append((exit_info.value.code, captured.out, captured.err))
    assert errors[0] == errors[1]
    code, out, err = errors[0]
    assert code == 2 and out == "" and re.fullmatch(rf"vanilla-transformer {argv[0]}: error: [^\n]+\n", err), err


@pytest.mark.parametrize("extra", ["train", "plot", "liger", "ctranslate2", "fp8"])
def test_an_extras_install_command_installs_from_where_the_package_came_from(extra, tmp_path, monkeypatch):
    """Not on PyPI yet: in a clone, `pip install 'vanilla-transformer[plot]'` fails, and the hints said it. From
    a source tree the hint installs from that tree; an installed copy, from the folder it was installed from
    (pip's direct_url.json), else by name. Every extra a hint names is one of pyproject.toml's."""
    import tomllib

    from vanilla_transformer import command_line

    assert extra in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert install_command(extra) == f"pip install -e '{REPO}[{extra}]'"

    class Installed:
        def __init__(self, origin):
            self.origin = origin

        def read_text(self, name):
            return self.origin if name == "direct_url.json" else None

    monkeypatch.setattr(command_line, "__file__", str(tmp_path / "site-packages/vanilla_transformer/command_line.py"))
    folder = tmp_path / "my clone"
    copy = json.dumps({"url": folder.as_uri(), "dir_info": {}})
    monkeypatch.setattr("importlib.metadata.distributions", lambda name: [Installed(None), Installed(copy)])
    assert install_command(extra) == f"pip install '{folder}[{extra}]'"
    monkeypatch.setattr("importlib.metadata.distributions", lambda name: [Installed(None)])
    assert install_command(extra) == f"pip install 'vanilla-transformer[{extra}]'"
