"""Sharing on the Hub: push with the real huggingface_hub client, pull into a cache, load offline.

A loopback server (tests/hub_server.py) speaks the Hub's HTTP API. Clients run in fresh processes,
because huggingface_hub reads its endpoint, its offline switch and its Xet switch when it is
imported: one process pushes and pulls over HTTP, one loads by repo id from the cache with
``HF_HUB_OFFLINE=1``, and one does the same without the package, through ``trust_remote_code=True``.
References: the original model's logits and beam search, the file list a user expects (written out
below), the package's source files, and the server's record of commits and requests.

The end of the file covers broken checkpoints: missing or damaged weights, another model's config.
"""

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load as load_safetensors
from transformers import AutoConfig, AutoModelForSeq2SeqLM, BertConfig

import vanilla_transformer.configuration_vanilla_transformer as configuration_module
import vanilla_transformer.modeling_vanilla_transformer as modeling_module
import vanilla_transformer.pipeline_vanilla_transformer as pipeline_module
import vanilla_transformer.tokenization_vanilla_transformer as tokenization_module
from helpers import run_without_package
from hub_server import USER, LoopbackHub, client_environment
from test_pipeline import TEXTS, one_torch_thread, paper_beam_search, train_copying_translator  # noqa: F401 (fixture)
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, write_model_card

REPO = f"{USER}/tiny-copy"  # pushed with model.push_to_hub and tokenizer.push_to_hub
FOLDER_REPO = f"{USER}/tiny-copy-folder"  # the same checkpoint uploaded as one folder
SOURCE_MODULES = [configuration_module, modeling_module, pipeline_module, tokenization_module]
# What a user expects in a checkpoint: weights, config (auto_map, custom_pipelines), decoding
# settings, tokenizer, the code that loads them without the package, and the model card.
CHECKPOINT_FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "generation_vanilla_transformer.py",
    "attention_backends.py",
    "training_kernels.py",
    "private_api.py",
    "pipeline_vanilla_transformer.py",
    "tokenization_vanilla_transformer.py",
    "README.md",
}
NEW_REPO_FILES = {".gitattributes"}  # the Hub creates every repository with this file
METRICS = [
    {
        "name": "BLEU",
        "type": "bleu",
        "value": 97.25,
        "dataset": "copy-task",
        "split": "test",
        "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    },
    {
        "name": "chrF",
        "type": "chrf",
        "value": 98.5,
        "dataset": "copy-task",
        "split": "test",
        "signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    },
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    server = LoopbackHub(tmp_path_factory.mktemp("hub-store"), lifetime=600).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def checkpoint(one_torch_thread, tmp_path_factory):
    """The trained tiny model saved as a Hub folder with its card, and the outputs the model gave."""
    model, tokenizer = train_copying_translator()
    folder = tmp_path_factory.mktemp("checkpoint")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_model_card(folder, model=model, languages=("en", "en"), repo_id=REPO, datasets=["copy-task"], metrics=METRICS)
    source = tokenizer(TEXTS, padding=True, return_tensors="pt")
    target_prefix = model.prepare_decoder_input_ids_from_labels(source["input_ids"])[:, :4]  # teacher forcing
    inputs = dict(texts=TEXTS, source=dict(source), model=dict(source, decoder_input_ids=target_prefix))
    inputs_file = tmp_path_factory.mktemp("inputs") / "inputs.pt"
    torch.save(inputs, inputs_file)
    with torch.no_grad():
        expected = dict(
            logits=model(**inputs["model"]).logits,
            generated=paper_beam_search(model, tokenizer, TEXTS),
            tokenized=source["input_ids"],
        )
    # The pipeline translates one sentence at a time unless given a batch_size.
    expected["translations"] = [
        {"translation_text": tokenizer.decode(paper_beam_search(model, tokenizer, [text])[0], skip_special_tokens=True)}
        for text in TEXTS
    ]
    return dict(folder=folder, inputs_file=inputs_file, expected=expected, model=model, tokenizer=tokenizer)


# Loads `source` with the Auto classes and the pipeline, and records what they give.
CHILD_PRELUDE = """
import torch
torch.set_num_threads(1)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

inputs = torch.load({inputs_file!r})

def outputs(source, task, **kwargs):
    model = AutoModelForSeq2SeqLM.from_pretrained(source, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    translate = pipeline(task, model=source, **kwargs)
    with torch.no_grad():
        logits = model(**inputs["model"]).logits
        generated = model.generate(**inputs["source"])
    return dict(
        logits=logits, generated=generated, translations=translate(inputs["texts"]),
        tokenized=tokenizer(inputs["texts"], padding=True, return_tensors="pt")["input_ids"],
        modules=[type(model).__module__, type(tokenizer).__module__, type(translate).__module__],
    )
"""

PUSH_AND_PULL = """
import vanilla_transformer
from huggingface_hub import HfApi, snapshot_download

api = HfApi()
model = AutoModelForSeq2SeqLM.from_pretrained({folder!r})
tokenizer = AutoTokenizer.from_pretrained({folder!r})
model.push_to_hub({repo!r})
tokenizer.push_to_hub({repo!r})
api.upload_file(path_or_fileobj={folder!r} + "/README.md", path_in_repo="README.md", repo_id={repo!r})
api.create_repo({folder_repo!r})
api.upload_folder(folder_path={folder!r}, repo_id={folder_repo!r}, commit_message="Upload checkpoint")
results = dict(user=api.whoami()["name"], online=outputs({repo!r}, "vanilla-translation"))
results["snapshot"] = snapshot_download({repo!r})
torch.save(results, "results.pt")
"""

OFFLINE_WITH_PACKAGE = """
import vanilla_transformer
torch.save(dict(offline=outputs({repo!r}, "vanilla-translation")), "results.pt")
"""

OFFLINE_WITHOUT_PACKAGE = """
import contextlib, io, re

results = dict(offline=outputs({repo!r}, "translation", trust_remote_code=True))
card = open({snapshot!r} + "/README.md", encoding="utf-8").read()
printed = io.StringIO()
with contextlib.redirect_stdout(printed):  # the card's example for users without the package
    exec(re.findall(r"```python\\n(.*?)```", card, re.DOTALL)[1], {{}})
results["card_example_printed"] = printed.getvalue().splitlines()
folder_pipeline = pipeline("translation", model={snapshot!r}, trust_remote_code=True)
results["folder_translations"] = folder_pipeline(inputs["texts"])
results["folder_pipeline_module"] = type(folder_pipeline).__module__
torch.save(results, "results.pt")
"""


def client_env(hub: LoopbackHub, home: Path, offline: bool) -> dict[str, str]:
    """Environment of a client process: the loopback Hub, its own cache, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.pop("PYTHONPATH", None)
    return {
        **env,
        **client_environment(hub, home, offline),
        "HF_MODULES_CACHE": str(home / "modules"),
        "OMP_NUM_THREADS": "1",
    }


def run_client(code: str, cwd: Path, env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"client failed:\n{result.stderr[-4000:]}"
    return torch.load(cwd / "results.pt")


@pytest.fixture(scope="module")
def client_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("client-home")  # HF_HOME shared by the three clients: one cache


@pytest.fixture(scope="module")
def pushed(hub, checkpoint, client_home, tmp_path_factory):
    code = CHILD_PRELUDE.format(inputs_file=str(checkpoint["inputs_file"])) + PUSH_AND_PULL.format(
        folder=str(checkpoint["folder"]), repo=REPO, folder_repo=FOLDER_REPO
    )
    return run_client(code, tmp_path_factory.mktemp("push"), client_env(hub, client_home, offline=False))


@pytest.fixture(scope="module")
def offline_with_package(hub, pushed, checkpoint, client_home, tmp_path_factory):
    before = len(hub.requests)
    code = CHILD_PRELUDE.format(inputs_file=str(checkpoint["inputs_file"])) + OFFLINE_WITH_PACKAGE.format(repo=REPO)
    results = run_client(code, tmp_path_factory.mktemp("offline"), client_env(hub, client_home, offline=True))
    return {**results, "requests": hub.requests[before:]}


@pytest.fixture(scope="module")
def offline_without_package(hub, pushed, checkpoint, client_home, tmp_path_factory):
    before = len(hub.requests)
    cwd = tmp_path_factory.mktemp("remote-code")
    code = CHILD_PRELUDE.format(inputs_file=str(checkpoint["inputs_file"])) + OFFLINE_WITHOUT_PACKAGE.format(
        repo=REPO, snapshot=pushed["snapshot"]
    )
    env = client_env(hub, client_home, offline=True)
    with pytest.MonkeyPatch.context() as patch:  # run_without_package passes os.environ on
        for name in set(os.environ) - set(env):
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        run_without_package(code, cwd=cwd)
    return {**torch.load(cwd / "results.pt"), "requests": hub.requests[before:]}


def assert_same_outputs(got: dict, expected: dict) -> None:
    assert torch.equal(got["logits"], expected["logits"])
    assert torch.equal(got["generated"], expected["generated"])
    assert torch.equal(got["tokenized"], expected["tokenized"])
    assert got["translations"] == expected["translations"]


# ---------------------------------------------------------------------------------------------
# Push
# ---------------------------------------------------------------------------------------------


def test_push_to_hub_uploads_exactly_the_checkpoint_files(hub, pushed):
    assert pushed["user"] == USER  # the token reached the server (whoami)
    assert set(hub.files(REPO)) == CHECKPOINT_FILES | NEW_REPO_FILES
    committed = {path for _, paths in hub.commits(REPO) for path in paths}
    assert committed == CHECKPOINT_FILES  # no stray file was ever uploaded


def test_pushed_code_is_the_package_source_and_the_card_is_the_one_written(hub, pushed, checkpoint):
    files = hub.files(REPO)
    for module in SOURCE_MODULES:
        assert files[Path(module.__file__).name].decode() == inspect.getsource(module)
    assert files["README.md"] == (checkpoint["folder"] / "README.md").read_bytes()


def test_pushed_weights_are_the_model_weights(hub, pushed, checkpoint):
    stored = load_safetensors(hub.files(REPO)["model.safetensors"])
    original = checkpoint["model"].state_dict()
    assert set(stored) <= set(original)  # tied copies are stored once
    for name, tensor in stored.items():
        assert torch.equal(tensor, original[name]), name


def test_pushed_config_maps_the_auto_classes_and_declares_the_pipeline(hub, pushed):
    config = json.loads(hub.files(REPO)["config.json"])
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert config["custom_pipelines"] == {
        "translation": {
            "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline",
            "pt": ["AutoModelForSeq2SeqLM"],
        }
    }
    tokenizer_config = json.loads(hub.files(REPO)["tokenizer_config.json"])
    tokenizer_class = tokenizer_config["auto_map"]["AutoTokenizer"][0]
    assert tokenizer_class == "tokenization_vanilla_transformer.VanillaTransformerTokenizer"


def test_card_on_the_hub_parses_back_into_the_scores_written(hub, pushed):
    card = ModelCard(hub.files(REPO)["README.md"].decode())
    assert card.data.pipeline_tag == "translation" and card.data.library_name == "transformers"
    scores = [
        (result.metric_type, result.metric_value, result.dataset_split, result.metric_args["signature"])
        for result in card.data.eval_results
    ]
    assert scores == [(m["type"], m["value"], m["split"], m["signature"]) for m in METRICS]


def test_folder_upload_is_one_commit_of_the_saved_bytes(hub, pushed, checkpoint):
    [(message, paths)] = hub.commits(FOLDER_REPO)
    assert message == "Upload checkpoint" and set(paths) == CHECKPOINT_FILES
    for name, content in hub.files(FOLDER_REPO).items():
        if name not in NEW_REPO_FILES:
            assert content == (checkpoint["folder"] / name).read_bytes(), name


# ---------------------------------------------------------------------------------------------
# Pull
# ---------------------------------------------------------------------------------------------


def test_model_pulled_over_http_gives_the_original_outputs(pushed, checkpoint):
    assert all(module.startswith("vanilla_transformer.") for module in pushed["online"]["modules"])
    assert_same_outputs(pushed["online"], checkpoint["expected"])


def test_snapshot_download_caches_the_head_commit_file_for_file(hub, pushed):
    snapshot = Path(pushed["snapshot"])
    head = hub.store.resolve(REPO, "main")
    assert snapshot.name == head and snapshot.parent.name == "snapshots"
    cached = {path.name: path.read_bytes() for path in snapshot.iterdir()}
    assert cached == hub.files(REPO)


def test_offline_load_by_repo_id_with_the_package_needs_no_server(offline_with_package, checkpoint):
    assert offline_with_package["requests"] == []
    assert all(module.startswith("vanilla_transformer.") for module in offline_with_package["offline"]["modules"])
    assert_same_outputs(offline_with_package["offline"], checkpoint["expected"])


def test_offline_remote_code_load_without_the_package_needs_no_server(offline_without_package, checkpoint):
    assert offline_without_package["requests"] == []
    modules = offline_without_package["offline"]["modules"] + [offline_without_package["folder_pipeline_module"]]
    assert all(module.startswith("transformers_modules.") for module in modules), modules
    assert_same_outputs(offline_without_package["offline"], checkpoint["expected"])
    assert offline_without_package["folder_translations"] == checkpoint["expected"]["translations"]


def test_cards_example_without_the_package_runs_from_the_cache(offline_without_package, checkpoint):
    model, tokenizer = checkpoint["model"], checkpoint["tokenizer"]
    example = re.search(r'tokenizer\(\["(.*)"\]', (checkpoint["folder"] / "README.md").read_text()).group(1)
    expected = tokenizer.batch_decode(paper_beam_search(model, tokenizer, [example]), skip_special_tokens=True)
    assert offline_without_package["card_example_printed"] == [str(expected)]


# ---------------------------------------------------------------------------------------------
# Broken checkpoints: the error says what is wrong and what to do
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def broken_copy(checkpoint, tmp_path) -> Path:
    folder = tmp_path / "broken"
    shutil.copytree(checkpoint["folder"], folder)
    return folder


def test_a_folder_without_weights_names_the_missing_file(broken_copy):
    (broken_copy / "model.safetensors").unlink()
    # transformers' own message is clear here: it is kept
    with pytest.raises(OSError, match=f"no file named model.safetensors.*found in directory {broken_copy}"):
        AutoModelForSeq2SeqLM.from_pretrained(broken_copy)


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _garbled_header(data: bytes) -> bytes:
    return data[:8] + b"#" * 16 + data[24:]  # same length; the JSON header no longer parses


@pytest.mark.parametrize(
    "damage", [_truncated, _garbled_header, lambda data: b""], ids=["truncated", "garbled", "empty"]
)
@pytest.mark.parametrize(
    "loader", [AutoModelForSeq2SeqLM, VanillaTransformerForConditionalGeneration], ids=["auto", "class"]
)
def test_damaged_weights_name_the_checkpoint_and_the_remedy(broken_copy, damage, loader):
    weights = broken_copy / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(OSError) as error:
        loader.from_pretrained(broken_copy)
    message = str(error.value)
    assert f"The weights of {broken_copy} cannot be read" in message
    assert "truncated or corrupt" in message and "force_download=True" in message


def test_another_models_config_is_refused_by_name(tmp_path):
    bert = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    bert.save_pretrained(tmp_path)
    # transformers only warns here, then builds a vanilla_transformer config from BERT's fields
    for load in (VanillaTransformerConfig.from_pretrained, VanillaTransformerForConditionalGeneration.from_pretrained):
        with pytest.raises(ValueError, match="describes a 'bert' model, not a 'vanilla_transformer' one"):
            load(tmp_path)
    # the Auto classes already say what is wrong
    assert type(AutoConfig.from_pretrained(tmp_path)) is BertConfig
    with pytest.raises(ValueError, match="Unrecognized configuration class.*BertConfig.*AutoModelForSeq2SeqLM"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
