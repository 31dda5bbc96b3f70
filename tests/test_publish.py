"""`vanilla-transformer publish` (vanilla_transformer.publish): a run's folder goes to the Hub as the model
alone. Pushed with the real huggingface_hub client to the loopback Hub (tests/hub_server.py) from a
fresh process; the reference is the list of files from_pretrained and the remote code read, written
out below, and the bytes on disk."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO
from hub_server import USER, LoopbackHub, client_environment
from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    train_tokenizer,
    write_model_card,
)
from vanilla_transformer.cli import main as cli

MODEL_FILES: set[str] = set()  # filled by run_folder
# What a training run leaves next to the model (checkpointing.py, run.py, the Trainer).
TRAINING_STATE = {
    "checkpoint-2/model.safetensors": b"weights",
    "checkpoint-2/optimizer.pt": b"adam",
    "checkpoint-2/ema.safetensors": b"average",
    "tokenizer/tokenizer.json": b"{}",
    "trainer_state.json": b"{}",
    "all_results.json": b"{}",
    "train_results.json": b"{}",
    "runs/events.out.tfevents": b"log",
    "generated_predictions.txt": b"hypotheses\n",
}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A model folder as a training run leaves it: the model, its card, and training state beside them."""
    folder = tmp_path_factory.mktemp("run")
    tokenizer = train_tokenizer(["a small text to learn a vocabulary from", "ein kleiner Text"] * 20, vocab_size=300)
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_model_card(folder, model=model, languages=("en", "de"))
    # The reference: every file that saving the model, its tokenizer and its card writes into a folder of
    # their own (the code files included: save_pretrained copies each relative import of the model file).
    global MODEL_FILES
    alone = tmp_path_factory.mktemp("alone")
    model.save_pretrained(alone)
    tokenizer.save_pretrained(alone)
    write_model_card(alone, model=model, languages=("en", "de"))
    MODEL_FILES = {path.name for path in alone.iterdir()}
    assert {
        "generation_vanilla_transformer.py",
        "attention_backends.py",
        "training_kernels.py",
        "private_api.py",
    } <= MODEL_FILES
    for name, content in TRAINING_STATE.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return folder


def test_the_files_to_publish_are_the_model_and_what_loads_it(run_folder, capsys):
    cli(["publish", str(run_folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert set(capsys.readouterr().out.split()) == MODEL_FILES


def marian_vocabulary_files() -> dict[str, str]:
    """MarianTokenizer's own files (its VOCAB_FILES_NAMES), read from transformers' source: the class needs
    sentencepiece to be imported, which the tests do without."""
    import ast
    from importlib import util

    tree = ast.parse(Path(util.find_spec("transformers.models.marian.tokenization_marian").origin).read_text())
    return next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "VOCAB_FILES_NAMES"
    )


def test_a_converted_marian_folder_publishes_its_sentencepiece_files(run_folder, tmp_path, capsys):
    """`convert from-marian` saves a MarianTokenizer: source.spm, target.spm, vocab.json (and target_vocab.json
    for separate vocabularies) beside tokenizer_config.json; without them the repo's tokenizer cannot load."""
    folder = tmp_path / "converted"
    folder.mkdir()
    ours = MODEL_FILES - {"tokenizer.json", "tokenization_vanilla_transformer.py"}  # a MarianTokenizer instead
    for name in ours:
        (folder / name).write_bytes((run_folder / name).read_bytes())
    vocabulary = set(marian_vocabulary_files().values()) - {"tokenizer_config.json"}
    assert {"source.spm", "target.spm", "vocab.json", "target_vocab.json"} <= vocabulary
    for name in vocabulary:
        (folder / name).write_bytes(b"sentencepiece model bytes")
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "MarianTokenizer"}')
    cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert set(capsys.readouterr().out.split()) == ours | vocabulary


def test_a_folder_without_a_model_card_is_published_with_a_warning(run_folder, tmp_path, capsys, caplog):
    """An averaged model has no card: its Hub page said nothing of its languages, task or scores, unsaid."""
    import logging
    import shutil

    folder = tmp_path / "no-card"
    shutil.copytree(run_folder, folder)
    (folder / "README.md").unlink()
    with caplog.at_level(logging.WARNING):
        cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert f"MODEL_DIR {folder} has no model card (README.md)" in caplog.text
    assert "README.md" not in capsys.readouterr().out.split()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cli(["publish", str(run_folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert "no model card" not in caplog.text


def test_a_checkpoint_of_a_moving_average_run_is_published_saying_which_weights(run_folder, tmp_path, caplog):
    """Its model.safetensors is the trained weights, not the average the run's final model holds; translate said
    so, publish did not."""
    import logging
    import shutil

    folder = tmp_path / "run" / "checkpoint-40"
    shutil.copytree(run_folder, folder)
    (folder / "ema.safetensors").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert f"MODEL_DIR {folder}: a checkpoint of a run with --ema_decay; its trained weights" in caplog.text
    assert "(model.safetensors) are published, not their moving average" in caplog.text
    assert f"the run's final model in {folder.parent} holds" in caplog.text


def test_publish_needs_no_training_extra(run_folder, monkeypatch, capsys):
    """A base install (no [train]) publishes: the package's training modules are never imported."""
    from test_cli import without_the_training_package

    without_the_training_package(monkeypatch)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as without the extra: importing it fails
    cli(["publish", str(run_folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert "model.safetensors" in capsys.readouterr().out.split()
    assert "vanilla_transformer.training" not in sys.modules


def test_publish_uploads_the_model_files_in_one_commit_and_nothing_of_the_run(run_folder, tmp_path):
    hub = LoopbackHub(tmp_path / "store", lifetime=600).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(client_environment(hub, tmp_path / "home"), PYTHONPATH=str(REPO))
        repo = f"{USER}/published"
        completed = subprocess.run(
            [sys.executable, "-m", "vanilla_transformer.cli", "publish", str(run_folder), "--repo_id", repo],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert [set(paths) for _, paths in hub.commits(repo)] == [MODEL_FILES]  # one commit, the model alone
        stored = hub.files(repo)
        assert set(stored) == MODEL_FILES | {".gitattributes"}
        assert all(stored[name] == (run_folder / name).read_bytes() for name in MODEL_FILES - {"README.md"})
        assert_published_card(stored["README.md"], run_folder, repo)
        assert "checkpoint-2/" in completed.stderr and "tokenizer/" in completed.stderr  # named as left out
    finally:
        hub.stop()


def assert_published_card(stored: bytes, folder: Path, repo_id: str) -> None:
    """The card as published: the folder's (write_model_card's, which names the repository it cannot know as
    ``<user>/FOLDER``), its examples loading ``repo_id`` and its model-index entry named after it, the rest
    as written (metadata and scores)."""
    from huggingface_hub import ModelCard

    local, card = ModelCard.load(folder / "README.md"), ModelCard(stored.decode())
    assert f"<user>/{folder.name}" in local.text and "<user>/" not in card.text
    assert f'model="{repo_id}"' in card.text and f'from_pretrained("{repo_id}"' in card.text
    assert card.data.model_name == repo_id.split("/")[-1] and card.text.startswith(f"\n# {repo_id.split('/')[-1]}\n")
    assert card.data.eval_results == local.data.eval_results and card.data.tags == local.data.tags
    name = repo_id.split("/")[-1]  # nothing else of the text changed
    assert card.text == local.text.replace(f"<user>/{folder.name}", repo_id).replace(
        f"# {folder.name}\n", f"# {name}\n"
    )


def test_a_card_whose_metadata_does_not_parse_is_refused_before_anything(run_folder, tmp_path, capsys):
    """It passed --dry-run, then the upload failed with yaml's traceback naming neither the file nor the fix."""
    import shutil

    folder = tmp_path / "broken-card"
    shutil.copytree(run_folder, folder)
    (folder / "README.md").write_text("---\nlanguage: [en, de\n---\n# a card\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit:
        cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    error = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(error.splitlines()) == 1, error
    assert f"{folder / 'README.md'}: its metadata (the YAML between the --- lines at the top) does not parse" in error


def test_with_hf_hub_offline_set_publish_says_so_at_once(run_folder, monkeypatch, capsys):
    """Offline mode is a choice, not a connection that broke: it was retried five times over 31 s, then called a
    broken upload to run again."""
    import huggingface_hub

    from vanilla_transformer import publish

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(publish.time, "sleep", lambda seconds: pytest.fail("retried"))
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", str(run_folder), "--repo-id", f"{USER}/x"])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1
    assert f"HF_HUB_OFFLINE is set, so nothing can be uploaded to {USER}/x" in error


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["upload", "dry-run"])
def test_a_folder_that_does_not_exist_is_refused_in_one_line(dry_run, tmp_path, capsys):
    """A misspelt runs/en-dee once listed nothing and exited 0 with --dry-run (a name with one slash passes for a
    Hub id elsewhere; publish uploads a folder on this disk)."""
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", "runs/en-dee", "--repo-id", f"{USER}/x", *dry_run])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1
    assert "MODEL_DIR runs/en-dee is not a folder" in error


def test_a_folder_without_its_tokenizer_is_refused_in_one_line(tmp_path, run_folder, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((run_folder / name).read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", str(bare), "--repo-id", f"{USER}/x"])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1
    assert error.startswith("vanilla-transformer publish: error:") and "tokenizer" in error


def test_a_folder_with_our_tokenizer_config_but_no_tokenizer_json_is_refused(tmp_path, run_folder, capsys):
    """VanillaTransformerTokenizer reads its vocabulary from tokenizer.json alone: a folder with only its
    tokenizer_config.json passed the check and would publish a repo whose tokenizer cannot load."""
    folder = tmp_path / "half"
    folder.mkdir()
    for name in MODEL_FILES - {"tokenizer.json"}:
        (folder / name).write_bytes((run_folder / name).read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1
    assert "tokenizer_config.json for VanillaTransformerTokenizer but no tokenizer.json" in error


@pytest.mark.parametrize("repo_id", ["you/x y", "you/a/b", "you/x.git", "-you/x"])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["upload", "dry-run"])
def test_a_repo_id_the_hub_cannot_hold_is_refused_before_anything(repo_id, dry_run, run_folder, capsys):
    """The reference is huggingface_hub's own rule; --dry-run once listed the files for any name, and the
    upload failed only at create_repo."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    with pytest.raises(HFValidationError):
        validate_repo_id(repo_id)
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", str(run_folder), f"--repo-id={repo_id}", *dry_run])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and not captured.out
    assert f"--repo-id {repo_id!r} is not a Hub repository name" in captured.err


def test_a_tokenizer_that_is_not_the_models_is_refused_before_anything(tmp_path, run_folder, capsys):
    """docs/hub.md says so; the folder once passed and was listed (and uploaded) whole. The reference is the
    pipeline's check of the same pair."""
    from transformers import AutoTokenizer

    from vanilla_transformer import check_tokenizer_matches_model

    folder = tmp_path / "other"
    folder.mkdir()
    for name in MODEL_FILES:
        (folder / name).write_bytes((run_folder / name).read_bytes())
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**saved, "vocab_size": 40, "decoder_vocab_size": 40, "pad_token_id": 5})
    )
    config = VanillaTransformerConfig.from_pretrained(folder)
    with pytest.raises(ValueError, match="does not match the model"):
        check_tokenizer_matches_model(AutoTokenizer.from_pretrained(folder), config)
    with pytest.raises(SystemExit) as exit_info:
        cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and not captured.out
    assert f"MODEL_DIR {folder}: The tokenizer does not match the model" in captured.err


def test_weights_in_the_older_torch_format_are_published_with_the_model(tmp_path, run_folder, capsys):
    """A folder whose weights are pytorch_model.bin (as opus-mt's are) passed the checks, and its upload held
    no weights at all. The reference: the files from_pretrained reads from that folder."""
    from safetensors.torch import load_file

    folder = tmp_path / "older"
    folder.mkdir()
    for name in MODEL_FILES - {"model.safetensors"}:
        (folder / name).write_bytes((run_folder / name).read_bytes())
    torch.save(load_file(run_folder / "model.safetensors"), folder / "pytorch_model.bin")
    VanillaTransformerForConditionalGeneration.from_pretrained(folder)  # loadable from these files alone
    cli(["publish", str(folder), "--repo-id", f"{USER}/x", "--dry-run"])
    assert set(capsys.readouterr().out.split()) == (MODEL_FILES - {"model.safetensors"}) | {"pytorch_model.bin"}
