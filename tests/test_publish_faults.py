"""`vanilla-transformer publish` over a connection that breaks off: all or nothing. The loopback Hub
(tests/hub_server.py) drops the connection half-way through a request, or after committing but before
answering; the real huggingface_hub client publishes from a fresh process. The references: every commit
the repository ever had (what any reader could have seen), and the bytes of the folder on disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import test_publish
from helpers import REPO
from hub_server import USER, LoopbackHub, client_environment
from test_publish import run_folder  # noqa: F401 (fixture)

REPO_ID = f"{USER}/cut"


@pytest.fixture
def hub(tmp_path):
    server = LoopbackHub(tmp_path / "store", lifetime=600).start()
    yield server
    server.stop()


def publish(hub: LoopbackHub, folder: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(client_environment(hub, home), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "vanilla_transformer.cli", "publish", str(folder), "--repo-id", REPO_ID, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_complete(hub: LoopbackHub, folder: Path) -> None:
    stored = hub.files(REPO_ID)
    assert set(stored) == test_publish.MODEL_FILES | {".gitattributes"}
    assert all(stored[name] == (folder / name).read_bytes() for name in test_publish.MODEL_FILES - {"README.md"})
    test_publish.assert_published_card(stored["README.md"], folder, REPO_ID)


def assert_never_half_a_model(hub: LoopbackHub) -> None:
    """At no commit did the repository hold some of the model's files without the others."""
    for tree in hub.trees(REPO_ID):
        assert not (tree & test_publish.MODEL_FILES) or test_publish.MODEL_FILES <= tree, sorted(tree)


def test_an_upload_cut_mid_way_leaves_no_model_and_a_rerun_completes_it(hub, run_folder, tmp_path):
    hub.cut("commit", times=1)
    failed = publish(hub, run_folder, tmp_path / "home", "--retries", "0")
    error = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode == 2 and error.startswith("vanilla-transformer publish: error:"), failed.stderr[-3000:]
    assert "broke off" in error and "run the same command again" in error
    assert set(hub.files(REPO_ID)) == {".gitattributes"}  # the repository exists, with nothing of the model
    rerun = publish(hub, run_folder, tmp_path / "home")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_complete(hub, run_folder)
    assert [set(paths) for _, paths in hub.commits(REPO_ID)] == [test_publish.MODEL_FILES]  # one commit
    assert_never_half_a_model(hub)


@pytest.mark.parametrize(
    "route, when",
    [  # one retried cut in the default suite (and test_retries_end_after_the_number_given), two in the slow one
        pytest.param("commit", "mid-request", marks=pytest.mark.slow),
        ("commit", "before-answer"),
        pytest.param("preupload", "mid-request", marks=pytest.mark.slow),
    ],
)
def test_a_broken_connection_is_retried_into_one_complete_commit(hub, run_folder, tmp_path, route, when):
    """Cut before the commit: retried. Cut after it (the answer lost): the retry finds every file there and
    commits nothing more (the second cut is never reached). The preupload request: huggingface_hub retries
    it itself."""
    hub.cut(route, times=2, when=when)
    completed = publish(hub, run_folder, tmp_path / "home")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert_complete(hub, run_folder)
    assert [set(paths) for _, paths in hub.commits(REPO_ID)] == [test_publish.MODEL_FILES]  # not two commits
    assert_never_half_a_model(hub)
    if (route, when) == ("commit", "mid-request"):
        assert completed.stderr.count("broke off") == 2 and "retry 2 of 5 in 2 s" in completed.stderr
    if (route, when) == ("commit", "before-answer"):
        assert completed.stderr.count("broke off") == 1


def test_retries_end_after_the_number_given(hub, run_folder, tmp_path):
    hub.cut("commit", times=3)
    failed = publish(hub, run_folder, tmp_path / "home", "--retries", "2")
    assert failed.returncode == 2 and "broke off 3 times" in failed.stderr, failed.stderr[-3000:]
    assert [request for request in hub.requests if request[1].startswith(f"/api/models/{REPO_ID}/commit/")] == [
        ("POST", f"/api/models/{REPO_ID}/commit/main")
    ] * 3
    assert set(hub.files(REPO_ID)) == {".gitattributes"}


def test_a_republish_in_shards_deletes_the_old_single_file_in_the_same_commit(hub, run_folder, tmp_path):
    """from_pretrained reads model.safetensors before an index of shards: left beside new shards, the old
    weights would load with the new config."""
    assert publish(hub, run_folder, tmp_path / "home").returncode == 0
    sharded = tmp_path / "sharded"
    shutil.copytree(run_folder, sharded, ignore=shutil.ignore_patterns("checkpoint-*", "model.safetensors"))
    model = AutoModelForSeq2SeqLM.from_pretrained(run_folder)
    model.save_pretrained(sharded, max_shard_size="200KB")
    shards = sorted(path.name for path in sharded.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    completed = publish(hub, sharded, tmp_path / "home")
    assert completed.returncode == 0, completed.stderr[-3000:]
    stored = hub.files(REPO_ID)
    assert "model.safetensors" not in stored and set(shards) | {"model.safetensors.index.json"} <= set(stored)
    assert len(hub.commits(REPO_ID)) == 2 and "model.safetensors" in hub.commits(REPO_ID)[1][1]  # one commit
    head = hub.store.root / REPO_ID / "commits" / hub.store.resolve(REPO_ID, "main")
    loaded = AutoModelForSeq2SeqLM.from_pretrained(head)  # what a reader of the repository loads
    assert all(torch.equal(loaded.state_dict()[name], value) for name, value in model.state_dict().items())


def test_the_files_a_trainers_pushes_left_and_an_earlier_card_are_deleted_in_the_publishing_commit(
    hub, run_folder, tmp_path
):
    """train --push_to_hub: the Trainer's pushes during training upload the whole output folder
    (training_args.bin, tokenizer/, runs/), and the final publish added the model beside them; a folder
    without a card published over an earlier one left that card describing other weights. Checkpoint
    folders (--hub_strategy checkpoint) stay."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from hub_server import TOKEN

    with pytest.MonkeyPatch.context() as environment:  # this process's client, for the setup commit
        for name, value in client_environment(hub, tmp_path / "home").items():
            environment.setenv(name, value)  # and the variables as they were after it (CI's HF_HOME, ...)
        api = HfApi(endpoint=hub.endpoint, token=TOKEN)
        api.create_repo(REPO_ID)
        leftovers = ["training_args.bin", "tokenizer/tokenizer.json", "runs/events.out.tfevents", "README.md"]
        api.create_commit(
            REPO_ID,
            [CommitOperationAdd(name, b"pushed during training") for name in [*leftovers, "last-checkpoint/x.pt"]],
            commit_message="Training in progress",
        )
    folder = tmp_path / "no-card"
    shutil.copytree(run_folder, folder)
    (folder / "README.md").unlink()
    (folder / "training_args.bin").write_bytes(b"args")
    completed = publish(hub, folder, tmp_path / "home")
    assert completed.returncode == 0, completed.stderr[-3000:]
    stored = hub.files(REPO_ID)
    assert set(stored) == (test_publish.MODEL_FILES - {"README.md"}) | {".gitattributes", "last-checkpoint/x.pt"}
    assert len(hub.commits(REPO_ID)) == 2  # the model and the deletions in one commit


def test_private_never_publishes_into_a_public_repo_and_a_new_branch_is_created(hub, run_folder, tmp_path):
    """create_repo(exist_ok=True) leaves an existing repo as it is: --private on a public one is refused before
    any upload (it would have published the model publicly). --revision names a branch, created from main
    when new (a commit goes to existing branches only); main keeps its own commits."""
    script = (
        "import json, sys\n"
        "from vanilla_transformer.publish import publish\n"
        "folder, repo, changed, results = sys.argv[1], sys.argv[2], sys.argv[3], {}\n"
        "publish(folder, repo)\n"
        "try:\n"
        "    publish(folder, repo, private=True)\n"
        "except ValueError as error:\n"
        "    results['private'] = str(error)\n"
        "publish(changed, repo, revision='v2')\n"
        "publish(folder, repo + '-private', private=True)\n"
        "print(json.dumps(results))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(client_environment(hub, tmp_path / "home"), PYTHONPATH=str(REPO))
    changed = shutil.copytree(run_folder, tmp_path / "changed")
    (changed / "README.md").write_text((changed / "README.md").read_text() + "\nA second version.\n")
    completed = subprocess.run(
        [sys.executable, "-c", script, str(run_folder), REPO_ID, str(changed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    message = json.loads(completed.stdout.splitlines()[-1])["private"]
    assert message.startswith(f"--private: {REPO_ID} exists and is public, and publishing does not change that")
    assert [paths for _, paths in hub.commits(REPO_ID)][1:] == [["README.md"]]  # none after the refusal; then v2's
    on_main, on_v2 = hub.files(REPO_ID), hub.files(REPO_ID, "v2")
    test_publish.assert_published_card(on_main["README.md"], run_folder, REPO_ID)  # main as it was
    assert on_v2["README.md"].endswith(b"A second version.\n") and set(on_v2) == set(on_main)
    assert hub.store.is_private(REPO_ID + "-private") and not hub.store.is_private(REPO_ID)
