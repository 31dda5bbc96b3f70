"""What the messages and reports tell a user to do, or count, checked against the tools they name: the launcher's
own parser, the average command's own checks, the train parser, an independent count of tokens and lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vanilla_transformer
from helpers import REPO
from test_translate import SENTENCES, one_by_one, save_model
from vanilla_transformer.training import averaging
from vanilla_transformer.training import translation as translate
from vanilla_transformer.training.arguments import refuse_processes_left_alone

# ---------------------------------------------------------------------------------------------
# Several processes on the CPU: the flag that works, not accelerate launch --cpu
# ---------------------------------------------------------------------------------------------


def launcher_chosen_by_accelerate(monkeypatch, flags: list[str]) -> str:
    """Which of accelerate's launchers ``accelerate launch FLAGS script.py`` would start (without starting it)."""
    from accelerate.commands import launch

    chosen = []
    for name in ("simple_launcher", "multi_gpu_launcher"):
        monkeypatch.setattr(launch, name, lambda args, name=name: chosen.append(name))
    launch.launch_command(launch.launch_command_parser().parse_args([*flags, "script.py"]))
    return chosen[0]


def test_processes_left_alone_on_the_cpu_are_told_use_cpu_and_not_the_launchers_cpu_flag(monkeypatch):
    """accelerate launch --cpu starts one process whatever --num_processes says (its simple launcher), so the
    message must not recommend it; the packaged ddp config without --cpu starts several."""
    from vanilla_transformer.command_line import accelerate_config_path

    config = ["--config_file", str(accelerate_config_path("ddp")), "--num_processes", "2"]
    assert launcher_chosen_by_accelerate(monkeypatch, ["--cpu", *config]) == "simple_launcher"
    assert launcher_chosen_by_accelerate(monkeypatch, config) == "multi_gpu_launcher"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as refused:
        refuse_processes_left_alone(SimpleNamespace(world_size=1))
    said = str(refused.value)
    assert "add --use_cpu true" in said and "accelerate launch --cpu" not in said and "(and accelerate" not in said


# ---------------------------------------------------------------------------------------------
# average --checkpoint-root: a folder without checkpoints, or a checkpoint itself
# ---------------------------------------------------------------------------------------------


def suggested_last(message: str) -> list[str]:
    words = message.replace(",", " ").split()
    return [
        words[i + 1] for i, word in enumerate(words[:-1]) if word == "--last" and words[i + 1].lstrip("-").isdigit()
    ]


def test_a_checkpoint_root_without_checkpoints_suggests_no_last_the_command_refuses(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(ValueError) as refused:
        averaging.last_checkpoints(tmp_path / "run", 3)
    message = str(refused.value)
    assert "it has 0 checkpoint-<step> folder(s)" in message
    for count in suggested_last(message)[1:]:  # the first is the one given
        averaging.parse_args(["--checkpoint-root", "x", "--last", count, "--output-dir", "y"])  # no SystemExit
    assert "--last 0" not in message


def test_a_checkpoint_given_as_the_root_is_named_with_its_run_folder(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        (run / f"checkpoint-{step}").mkdir(parents=True)
    checkpoint = run / "checkpoint-2"
    with pytest.raises(ValueError) as refused:
        averaging.last_checkpoints(checkpoint, 1)
    message = str(refused.value)
    assert f"{checkpoint} is itself a checkpoint" in message and f"--checkpoint-root {run}" in message
    assert checkpoint in averaging.checkpoint_folders(run)  # the folder named does hold it
    assert "--last 0" not in message


# ---------------------------------------------------------------------------------------------
# A Hub dataset out of reach: how to go on
# ---------------------------------------------------------------------------------------------


def test_a_hub_dataset_out_of_reach_names_the_local_files_way(tmp_path):
    """With no Hub (offline) and nothing cached, the recipe's dataset cannot load: the line says how to train
    on local files, and those flags do replace the recipe's Hub dataset."""
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    command = [sys.executable, "-m", "vanilla_transformer.cli", "train", "multi30k", "--use_cpu", "true"]
    completed = subprocess.run(
        [*command, "--output_dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=300,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    last = completed.stderr.strip().splitlines()[-1]
    assert "bentrevett/multi30k" in last and "--dataset_name none" in last, last
    assert "--train_source_file/--train_target_file" in last and "--train_file" in last, last
    from vanilla_transformer.training.options import parse_arguments

    (tmp_path / "a.en").write_text("a\n")
    (tmp_path / "a.de").write_text("b\n")
    local = ["--train_source_file", str(tmp_path / "a.en"), "--train_target_file", str(tmp_path / "a.de")]
    _, data_args, _ = parse_arguments(
        ["multi30k", "--dataset_name", "none", *local, "--output_dir", str(tmp_path / "r"), "--use_cpu", "true"]
    )
    assert data_args.dataset_name is None and data_args.train_source_file == str(tmp_path / "a.en")


# ---------------------------------------------------------------------------------------------
# gen_len: the generated tokens, as run_translation.py counts MarianMT's
# ---------------------------------------------------------------------------------------------


def test_gen_len_counts_the_tokens_after_the_start_token_as_for_a_marian_start(tmp_path):
    """Our decoder starts with <s>, MarianMT's with <pad>; run_translation.py's count (every non-pad token)
    leaves the latter out. The same generated tokens must give the same gen_len whichever start token."""
    from transformers import EvalPrediction

    from vanilla_transformer.training.metrics import TranslationMetrics

    tokenizer = vanilla_transformer.train_tokenizer(iter(SENTENCES * 3), vocab_size=300)
    pad, bos, eos = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    words = [tokenizer(text_target=s, add_special_tokens=False)["input_ids"] for s in SENTENCES[:3]]
    generated = [words[0] + [eos], words[1] + [eos], words[2]]  # the last cut off by the length limit
    width = 1 + max(map(len, generated))
    ours = np.array([[bos] + g + [pad] * (width - 1 - len(g)) for g in generated])
    marian = np.where(np.arange(width) == 0, pad, ours)  # the same tokens after a <pad> start
    run_translation_gen_len = np.mean([np.count_nonzero(p != pad) for p in marian])
    by_hand = np.mean([len(g) for g in generated])  # tokens generated, </s> included
    labels = np.array([[bos] + g + [-100] * (width - 1 - len(g)) for g in generated])
    result = TranslationMetrics(tokenizer)(EvalPrediction(predictions=ours, label_ids=labels))
    assert result["gen_len"] == pytest.approx(by_hand) == pytest.approx(run_translation_gen_len)
    assert result["unfinished_percent"] == pytest.approx(100 / 3)


# ---------------------------------------------------------------------------------------------
# translate --metrics-json: unfinished, skipped and truncated lines
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("model"))


def test_translate_metrics_report_the_share_cut_off_by_the_length_limit(model_dir, tmp_path):
    """Against each line decoded alone: the share whose output holds no </s> after the start token (an
    untrained model under an 8-token limit), blank lines not counted."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    lines = [*SENTENCES, ""]
    unfinished = 0
    for sentence in SENTENCES:
        with torch.no_grad():
            alone = model.generate(**tokenizer([sentence], return_tensors="pt"))[0].tolist()
        unfinished += tokenizer.eos_token_id not in alone[1:]
    source, metrics = tmp_path / "in.txt", tmp_path / "m.json"
    source.write_text("".join(line + "\n" for line in lines))
    argv = ["--model", str(model_dir), "--input", str(source), "--output", str(tmp_path / "o"), "--no-progress"]
    translate.main([*argv, "--metrics-json", str(metrics)])
    written = json.loads(metrics.read_text())
    assert unfinished > 0  # the case the report is for
    assert written["unfinished_percent"] == pytest.approx(100 * unfinished / len(SENTENCES))
    assert written["skipped_long"] == written["truncated_long"] == 0
    assert (tmp_path / "o").read_text().splitlines() == [*one_by_one(model, tokenizer, SENTENCES), ""]


@pytest.mark.parametrize("flag", ["--skip-long", "--truncate"])
def test_translate_metrics_count_the_lines_skipped_or_truncated(tmp_path, flag):
    from transformers import AutoTokenizer

    folder = save_model(tmp_path / "short", max_position_embeddings=12)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    long_line = " ".join(["medium sentence"] * 10)
    lines = ["short", long_line, "x", long_line + " again"]
    too_long = sum(len(tokenizer(line)["input_ids"]) > 12 for line in lines)
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines))
    argv = ["--model", str(folder), "--input", str(source), "--output", str(tmp_path / "o"), "--no-progress"]
    result = translate.main([*argv, flag, "--metrics-json", str(tmp_path / "m.json")])
    written = json.loads((tmp_path / "m.json").read_text())
    assert too_long == 2 and written == {key: result[key] for key in written}
    assert written["skipped_long"] == (too_long if flag == "--skip-long" else 0)
    assert written["truncated_long"] == (too_long if flag == "--truncate" else 0)
    assert 0 <= written["unfinished_percent"] <= 100


# ---------------------------------------------------------------------------------------------
# Names the docs import
# ---------------------------------------------------------------------------------------------


def test_every_name_the_docs_import_from_the_training_package_is_there():
    import re

    import vanilla_transformer.training as training
    from vanilla_transformer.training.checkpointing import TrainingInterrupted

    text = " ".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").glob("*.md")))
    named = set(re.findall(r"from vanilla_transformer\.training\s+import\s+(\w+)", text))
    assert "TrainingInterrupted" in named
    assert all(name in training.__all__ and hasattr(training, name) for name in named), named - set(training.__all__)
    assert training.TrainingInterrupted is TrainingInterrupted


# ---------------------------------------------------------------------------------------------
# A tokenizer that does not match the model, from the command line: the flags, not Python calls
# ---------------------------------------------------------------------------------------------


def option_strings(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_a_tokenizer_bigger_than_the_model_is_refused_naming_the_flags(model_dir, tmp_path):
    from vanilla_transformer.training import run
    from vanilla_transformer.training.options import build_parser

    bigger = vanilla_transformer.train_tokenizer(iter([f"w{i} v{i}" for i in range(400)] + SENTENCES), vocab_size=600)
    bigger.save_pretrained(tmp_path / "bigger")
    source = tmp_path / "in.txt"
    source.write_text("short\n")
    argv = ["--model", str(model_dir), "--tokenizer", str(tmp_path / "bigger"), "--input", str(source)]
    with pytest.raises(ValueError, match="more than the model's vocab_size") as refused:
        translate.main([*argv, "--output", str(tmp_path / "o")])
    said = str(refused.value)
    assert "--tokenizer" in said and f"--model {model_dir}" in said and "from_pretrained" not in said
    assert {"--tokenizer", "--model"} <= option_strings(translate.build_parser())
    with pytest.raises(ValueError, match="more than the model's vocab_size") as refused:
        run.prepare_model(bigger, checkpoint=str(model_dir))
    said = str(refused.value)
    assert "--tokenizer_name_or_path" in said and "from_pretrained" not in said
    assert {"--tokenizer_name_or_path", "--model_name_or_path"} <= option_strings(build_parser())
