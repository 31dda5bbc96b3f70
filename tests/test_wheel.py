"""What `pip install vanilla-transformer[train]` gives a user: the wheel built from this tree, installed
into a fresh virtual environment, runs the installed commands with the packaged recipes and launch
configs, and nothing of the source tree is on its path.

The environment reuses the dependencies already installed for the tests (offline): a ``.pth`` file
puts their site-packages folder on the path as a plain folder, so its ``.pth`` files, among them the
editable install of this tree, are not run. Building the wheel and reading its contents is the fast
test; installing it and running the commands (a process each, each importing torch) is slow.
"""

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from helpers import REPO
from test_train import reverse_pairs, write_pairs


def run(
    command: list, cwd: Path, timeout: int = 300, check: bool = True, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the wheel installed
    completed = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env={**inherited, "HF_HUB_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
    if check:
        assert completed.returncode == 0, f"{command}:\n{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}"
    return completed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this tree."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy of what the wheel is built from: the tree stays clean of build/
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "vanilla_transformer_command.py"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "vanilla_transformer", source / "vanilla_transformer", ignore=shutil.ignore_patterns("__pycache__")
    )
    run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            root / "dist",
        ],
        cwd=source,
    )  # setuptools builds wheels itself since 70.1: the `wheel` package is not needed
    return next((root / "dist").glob("vanilla_transformer-*.whl"))


def test_the_wheel_holds_the_command_the_recipes_and_the_launch_configs(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(name).decode() for name in names if name.endswith("entry_points.txt"))
    packaged = {name for name in names if name.endswith(".yaml")}
    assert packaged == {
        f"vanilla_transformer/training/{folder}/{path.name}"
        for folder, source in (("recipes", "recipes"), ("accelerate_configs", "accelerate"))
        for path in (REPO / "training" / source).glob("*.yaml")
    }
    assert {
        "vanilla_transformer/cli.py",
        "vanilla_transformer/publish.py",
        "vanilla_transformer/training/options.py",
        "vanilla_transformer_command.py",
        "vanilla_transformer/help_screens.json",
    } <= names
    assert "vanilla-transformer = vanilla_transformer_command:main" in entry_points
    assert (
        "vanilla-transformer-train-tokenizer = vanilla_transformer.tokenization_vanilla_transformer:main"
        in entry_points
    )


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The bin folder of a new virtual environment holding the wheel."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            wheel,
        ],
        cwd=root,
    )
    purelib = Path(
        run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    )
    shared = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    (purelib / "shared_dependencies.pth").write_text("".join(path + "\n" for path in shared))
    return venv / "bin"


@pytest.mark.slow
def test_the_wheel_installs_the_command_the_package_data_and_no_source_tree(installed, tmp_path):
    located = run(
        [installed / "python", "-c", "import vanilla_transformer; print(vanilla_transformer.__file__)"], cwd=tmp_path
    ).stdout.strip()
    assert Path(located).is_relative_to(installed.parent), located  # not this tree, not the editable install
    for kind, name in (("config", "ddp"), ("recipe", "multi30k")):
        path = Path(run([installed / "vanilla-transformer", kind, name], cwd=tmp_path).stdout.strip())
        assert (
            path.is_relative_to(installed.parent)
            and path.read_text()
            == (REPO / "training" / ("accelerate" if kind == "config" else "recipes") / f"{name}.yaml").read_text()
        )
    listed = run([installed / "vanilla-transformer", "recipe"], cwd=tmp_path).stdout
    assert {line.split("\t")[0] for line in listed.splitlines()} == {
        path.stem for path in (REPO / "training" / "recipes").glob("*.yaml")
    }
    answered = run(
        [
            installed / "python",
            "-c",
            "import sys, vanilla_transformer_command as command; "
            "command.main(['config', 'ddp']); "
            "print(sorted({'torch', 'transformers', 'vanilla_transformer'} & set(sys.modules)))",
        ],
        cwd=tmp_path,
    ).stdout.splitlines()  # the console script's own answer, from beside the package
    ddp = Path(answered[0])
    assert answered[1:] == ["[]"] and ddp.is_relative_to(installed.parent), answered
    assert ddp.read_text() == (REPO / "training" / "accelerate" / "ddp.yaml").read_text()
    misspelt = run([installed / "vanilla-transformer", "config", "dpp"], cwd=tmp_path, check=False)
    assert misspelt.returncode == 2 and "did you mean 'ddp'" in misspelt.stderr, misspelt.stderr[-2000:]
    assert (installed / "vanilla-transformer-train-tokenizer").is_file()


@pytest.mark.slow
def test_train_help_from_the_command_and_from_python_dash_m(installed, tmp_path):
    """A fresh install's first `train --help` prints the packaged screen without importing torch, transformers
    or the package: the same text as `python -m`'s parser prints at the width it was rendered at."""
    from vanilla_transformer.command_line import HELP_SCREENS, help_rendered_with

    rendered_with = json.loads(HELP_SCREENS.read_text(encoding="utf-8"))["rendered_with"]
    if rendered_with != help_rendered_with():  # e.g. the lowest supported versions: the parsers render it
        pytest.skip(f"help_screens.json was rendered with {rendered_with}, not {help_rendered_with()}")
    env = {"HF_HOME": str(tmp_path / "hf-home"), "COLUMNS": "80"}
    command = run(
        [
            installed / "python",
            "-c",
            "import sys, vanilla_transformer_command as command; "
            "command.main(['train', '--help']); print(sorted({'torch', 'transformers', 'vanilla_transformer'} "
            "& set(sys.modules)), file=sys.stderr)",
        ],
        cwd=tmp_path,
        env=env,
    )
    texts = [
        run(each, cwd=tmp_path, env=env).stdout
        for each in (
            [installed / "vanilla-transformer", "train", "--help"],
            [installed / "python", "-m", "vanilla_transformer.training.run", "--help"],
        )
    ]
    assert command.stderr.strip() == "[]", command.stderr[-2000:]
    assert command.stdout == texts[0] == texts[1] and not (tmp_path / "hf-home").exists()
    headings = [line for line in texts[0].splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings[1:6] == ["data:", "model:", "training:", "evaluation and decoding:", "Seq2SeqTrainingArguments:"], (
        headings
    )
    assert "--max_tokens" in texts[0] and "--ema_decay" in texts[0]


@pytest.mark.slow
def test_a_packaged_recipe_trains_two_updates_and_the_result_translates(installed, tmp_path):
    """`train multi30k` on tiny local files instead of its Hub dataset, two updates, then `translate`."""
    data = tmp_path / "data"
    data.mkdir()
    for role, count, seed in (("train", 200, 1), ("valid", 4, 2), ("test", 5, 3)):
        write_pairs(data, role, reverse_pairs(count, seed=seed))
    output = tmp_path / "run"
    run(
        [
            installed / "vanilla-transformer",
            "train",
            "multi30k",
            "--dataset_name",
            "none",
            "--train_source_file",
            data / "train.src",
            "--train_target_file",
            data / "train.tgt",
            "--validation_source_file",
            data / "valid.src",
            "--validation_target_file",
            data / "valid.tgt",
            "--do_predict",
            "false",
            "--max_steps",
            "2",
            "--output_dir",
            output,
            "--tokenizer_vocab_size",
            "300",
            "--report_to",
            "none",
            "--use_cpu",
            "--generation_max_length",
            "8",
            "--cache_dir",
            tmp_path / "cache",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert (output / "model.safetensors").is_file() and (output / "all_results.json").is_file()
    translated = run(
        [
            installed / "vanilla-transformer",
            "translate",
            "--model",
            output,
            "--input",
            data / "test.src",
            "--num_beams",
            "2",
            "--max_new_tokens",
            "8",
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert len(translated.stdout.splitlines()) == 5
