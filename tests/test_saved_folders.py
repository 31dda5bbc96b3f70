"""A folder saved by a user's own script with stock tools (Seq2SeqTrainer.save_model, as transformers'
run_translation.py ends) holds a tokenizer that truncates to what the model accepts, though the tokenizer
was saved with a longer model_max_length. Reference: the model's own refusal of a longer input. Its card,
written by the script's own last lines (create_model_card or push_to_hub), names the task and the package
on the Hub (the loopback server of tests/hub_server.py), read back from the YAML front matter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments

from helpers import REPO
from hub_server import USER, LoopbackHub, client_environment
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer

POSITIONS = 24  # fewer than the tokenizer's default model_max_length (1024)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """As run_translation.py ends: trainer.save_model(), the tokenizer as it was given."""
    folder = tmp_path_factory.mktemp("saved")
    tokenizer = train_tokenizer(["a few words to learn from", "noch ein paar Worte"] * 20, vocab_size=300)
    assert tokenizer.model_max_length > POSITIONS
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        vocab_size=len(tokenizer),
        max_position_embeddings=POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(output_dir=str(folder), report_to="none", use_cpu=True)
    trainer = Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)
    trainer.save_model()
    return folder


def test_truncation_keeps_what_the_model_accepts(saved):
    tokenizer, model = AutoTokenizer.from_pretrained(saved), AutoModelForSeq2SeqLM.from_pretrained(saved)
    assert tokenizer.model_max_length == POSITIONS
    text = " ".join(["words"] * 100)
    with pytest.raises(Exception):  # noqa: B017 (the model refuses more positions than it has)
        model(**tokenizer(text, return_tensors="pt"), decoder_input_ids=torch.tensor([[tokenizer.bos_token_id]]))
    inputs = tokenizer(text, truncation=True, return_tensors="pt")
    assert inputs["input_ids"].shape[1] == POSITIONS
    model(**inputs, decoder_input_ids=torch.tensor([[tokenizer.bos_token_id]]))  # accepted


# ---------------------------------------------------------------------------------------------
# The card: what run_translation.py's last lines write, and what reaches the Hub
# ---------------------------------------------------------------------------------------------

# run_translation.py's end, on our checkpoint loaded as remote code (the script never imports the package):
# save_model(), then create_model_card(**kwargs), or push_to_hub(**kwargs) with --push_to_hub.
RUN_TRANSLATION_END = """
import json, sys
from pathlib import Path
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments

checkpoint, output, push = {checkpoint!r}, {output!r}, {push!r}
model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
assert "vanilla_transformer" not in sys.modules
args = Seq2SeqTrainingArguments(output_dir=output, report_to="none", use_cpu=True, push_to_hub=push,
                                hub_model_id={repo!r} if push else None)
trainer = Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)
trainer.save_model()
kwargs = {{"finetuned_from": checkpoint, "tasks": "translation", "dataset_tags": "wmt14", "dataset_args": "de-en",
          "dataset": "wmt14 de-en", "language": ["en", "de"]}}
if push:
    trainer.push_to_hub(**kwargs)
else:
    trainer.create_model_card(**kwargs)
    from vanilla_transformer.publish import publish
    publish(output, {repo!r})
"""


def front_matter(card: bytes) -> dict:
    """The YAML metadata at the top of a README.md, parsed on its own (not through huggingface_hub)."""
    text = card.decode("utf-8")
    assert text.startswith("---\n"), text[:200]
    return yaml.safe_load(text.split("\n---\n", 1)[0][4:])


@pytest.mark.parametrize("push", [True, False], ids=["push_to_hub", "create_model_card then publish"])
def test_run_translations_card_on_the_hub_names_the_task_and_the_package(saved, tmp_path, push):
    hub = LoopbackHub(tmp_path / "store", lifetime=600).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(client_environment(hub, tmp_path / "home"), PYTHONPATH=str(REPO))
        repo, output = f"{USER}/run-translation", tmp_path / "output"
        code = RUN_TRANSLATION_END.format(checkpoint=str(saved), output=str(output), push=push, repo=repo)
        completed = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        metadata = front_matter(hub.files(repo)["README.md"])
    finally:
        hub.stop()
    assert {"translation", "vanilla-transformer", "custom_code", "generated_from_trainer"} <= set(metadata["tags"])
    assert metadata["language"] == ["en", "de"] and metadata["datasets"] == ["wmt14"]  # the script's own kept
    if not push:  # the folder's own card stays as the Trainer wrote it (its tags alone)
        assert "vanilla-transformer" not in front_matter((output / "README.md").read_bytes())["tags"]


def test_a_card_that_names_the_package_is_published_as_it_is(tmp_path):
    from vanilla_transformer import VanillaTransformerForConditionalGeneration, write_model_card
    from vanilla_transformer.publish import card_to_publish

    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=300))
    model.save_pretrained(tmp_path)
    write_model_card(tmp_path, model=model, languages=("en", "de"))
    assert card_to_publish(tmp_path) is None  # uploaded byte for byte
    (tmp_path / "README.md").unlink()
    assert card_to_publish(tmp_path) is None  # no card: nothing is invented
