"""The torch range that pyproject.toml declares: it keeps a user's torch, and its floor is the one tested.

`pip install vanilla-transformer` must leave an installed torch alone wherever the package works with it: the
H200 machine of docs/benchmarks/gpu.md (2026-11-27) ran every GPU benchmark unchanged on torch 2.11.0+cu130.
`make test-floor` sets VANILLA_TRANSFORMER_FLOOR_RUN=1, and there the installed versions must be the floors.
"""

import os
from importlib.metadata import requires, version

import pytest
import tomllib
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from floor_requirements import PYPROJECT, floor_pins
from test_modeling import source_batch, tiny_model
from vanilla_transformer import attention_backends, cli
from vanilla_transformer.private_api import TESTED

# torch builds users run the package on: the H200 machine's (docs/benchmarks/gpu.md), a CPU wheel's.
USERS_TORCH = ["2.11.0+cu130", "2.11.0", "2.13.0+cpu"]

pytestmark = pytest.mark.floor


def declared(name: str) -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, dependencies) if r.name == name)


def pinned(name: str) -> str:
    return next(pin.split("==")[1] for pin in floor_pins(PYPROJECT.read_text()) if pin.startswith(f"{name}=="))


@pytest.mark.parametrize("torch_version", USERS_TORCH)
def test_the_declared_torch_range_keeps_a_users_torch(torch_version):
    assert declared("torch").specifier.contains(torch_version)


def test_the_declared_torch_floor_is_the_oldest_version_admitted_and_the_one_tested():
    floor = pinned("torch")
    specifier = declared("torch").specifier
    assert specifier.contains(floor) and not specifier.contains("2.6.0")  # 2.6.0 lacks torch.float8_e8m0fnu
    assert TESTED["torch"][0] == floor


def test_the_transformers_floor_accepts_the_torch_floor():
    """transformers 5.10.1 asks for torch>=2.4 (it imports torch.float8_e8m0fnu, new in 2.7), 5.24.0 for
    torch>=2.6: the torch floor must satisfy the installed transformers' own requirement."""
    torch_requirements = [Requirement(r) for r in requires("transformers") if r.startswith("torch>")]
    assert torch_requirements, "transformers no longer declares a torch requirement"
    assert all(r.specifier.contains(pinned("torch")) for r in torch_requirements)


def test_the_floor_run_runs_on_the_floor_versions():
    if os.environ.get("VANILLA_TRANSFORMER_FLOOR_RUN") != "1":
        pytest.skip("the floor run only (make test-floor)")
    installed = {pin.split("==")[0]: Version(version(pin.split("==")[0])) for pin in floor_pins(PYPROJECT.read_text())}
    floors = {pin.split("==")[0]: Version(pin.split("==")[1]) for pin in floor_pins(PYPROJECT.read_text())}
    assert {name: v.release for name, v in installed.items()} == {name: v.release for name, v in floors.items()}


# --- features that need a newer torch than the floor: one line naming the option and the torch needed ---------

FLOOR_TORCH = "2.7.0+cu126"  # the floor run's build (make test-floor)


def older_torch(monkeypatch, installed: str = FLOOR_TORCH) -> None:
    monkeypatch.setattr(attention_backends, "torch_version", lambda: installed)


@torch.no_grad()
def test_flex_attention_on_the_cpu_with_the_floor_torch_is_one_line_naming_the_option_and_the_torch(monkeypatch):
    older_torch(monkeypatch)
    model = tiny_model()
    model.set_attn_implementation("flex_attention")
    input_ids, attention_mask = source_batch()
    with pytest.raises(ValueError) as refused:
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("attn_implementation='flex_attention': flex attention on the CPU needs torch >= 2.9.0")
    assert f"torch {FLOOR_TORCH}" in message and "pip install 'torch>=2.9.0'" in message


@pytest.mark.parametrize("installed", ["2.9.0", "2.9.0+cpu", "2.11.0+cu130", "2.13.0"])
def test_flex_attention_on_the_cpu_is_allowed_from_torch_2_9(monkeypatch, installed):
    older_torch(monkeypatch, installed)
    attention_backends.check_flex_attention_on_cpu("attn_implementation='flex_attention'")


@pytest.mark.parametrize("installed", ["2.7.0", "2.7.0+cu126", "2.8.0+cpu"])
def test_flex_attention_on_the_cpu_is_refused_before_torch_2_9(monkeypatch, installed):
    older_torch(monkeypatch, installed)
    with pytest.raises(ValueError, match=r"needs torch >= 2\.9\.0"):
        attention_backends.check_flex_attention_on_cpu("attn_implementation='flex_attention'")


@torch.no_grad()
def test_sdpa_and_eager_attention_are_unaffected_by_the_floor_torch(monkeypatch):
    older_torch(monkeypatch)
    model = tiny_model()
    input_ids, attention_mask = source_batch()
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])


def test_the_train_command_refuses_cpu_flex_attention_on_the_floor_torch_before_reading_data(monkeypatch, capsys):
    older_torch(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        cli.main(
            [
                "train",
                "--train_file",
                "/nonexistent/train.tsv",
                "--preset",
                "tiny",
                "--output_dir",
                "/nonexistent/out",
                "--report_to",
                "none",
                "--use_cpu",
                "--attn_implementation",
                "flex_attention",
            ]
        )
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--attn_implementation flex_attention: flex attention on the CPU needs torch >= 2.9.0" in error
    assert "/nonexistent" not in error and "Traceback" not in capsys.readouterr().err
