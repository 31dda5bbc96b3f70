"""Several processes: FSDP with training/accelerate/fsdp.yaml on 2 CPU processes (gloo) against one
process with the same batches, its checkpoints as Hub folders that load and average, and its wrapping
policy as accelerate reads it from the file. (DDP on 2 CPU processes: tests/test_train.py.)

accelerate 1.15 does not run FSDP on the CPU by itself (see tests/fsdp_on_cpu.py, which lifts exactly
that); train.py refuses such a launch instead of quietly running DDP.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
)
from vanilla_transformer.training import run as train
from vanilla_transformer.training.averaging import average_checkpoints

REPO = Path(__file__).resolve().parents[1]
FSDP_CONFIG = REPO / "training" / "accelerate" / "fsdp.yaml"
LETTERS = "a b c d e f g h i j".split()


def write_reversal_task(folder: Path, name: str, count: int, seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    pairs = [[rng.choice(LETTERS) for _ in range(rng.randint(2, 5))] for _ in range(count)]
    source, target = folder / f"{name}.src", folder / f"{name}.tgt"
    source.write_text("".join(" ".join(words) + "\n" for words in pairs), encoding="utf-8")
    target.write_text("".join(" ".join(reversed(words)) + "\n" for words in pairs), encoding="utf-8")
    return str(source), str(target)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_environment(config: Path, monkeypatch) -> None:
    """The environment `accelerate launch --config_file config` gives its processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(config), "x.py"]))
    for name, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(name, value)


def test_fsdp_config_shards_each_layer_and_saves_full_state_dicts(monkeypatch):
    """fsdp.yaml as accelerate reads it: FSDP 2, one shard group per encoder and decoder layer (the
    shared embedding matrix stays in the root group), checkpoints gathered into one state dict."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from torch.distributed.fsdp import StateDictType

    launcher_environment(FSDP_CONFIG, monkeypatch)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=50))
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    wrapped = [module for module in model.modules() if policy(module)]
    layers = [
        m for m in model.modules() if isinstance(m, (VanillaTransformerEncoderLayer, VanillaTransformerDecoderLayer))
    ]
    assert wrapped == layers and len(layers) == 4


def test_fsdp_launch_on_the_cpu_is_refused_rather_than_run_as_ddp(tmp_path, monkeypatch):
    launcher_environment(FSDP_CONFIG, monkeypatch)
    source, target = write_reversal_task(tmp_path, "train", 50, seed=1)
    with pytest.raises(ValueError, match="does not shard on cpu.*ddp config"):
        train.build_trainer(
            *train.parse_arguments(
                [
                    "--train_source_file",
                    source,
                    "--train_target_file",
                    target,
                    "--preset",
                    "tiny",
                    "--tokenizer_vocab_size",
                    "270",
                    "--output_dir",
                    str(tmp_path / "out"),
                    "--use_cpu",
                ]
            )
        )


def noise_only(weights: dict) -> set[str]:
    """The key projections' biases: their gradient is 0 in exact arithmetic (a constant added to every
    score of a query leaves its softmax unchanged), so Adam's steps on them are rounding noise, which
    differs between any two summation orders."""
    return {key for key in weights if key.endswith("k_proj.bias")}


def launch_on_two_processes(config: Path, script: Path, arguments: list[str]) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file config --num_processes 2 script arguments`, which must succeed."""
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        str(script),
        *arguments,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, why_it_failed(completed.stderr)
    return completed


def why_it_failed(stderr: str) -> str:
    """A failed launch's cause: the lines that say what went wrong in each process (a C++ abort's 'terminate
    called', an exception's last line), which the launcher's own report at the end pushes out of the tail."""
    telling = ("terminate called", "what():", "Error", "Exception", "Traceback", "Signal ", "exitcode")
    lines = [line for line in stderr.splitlines() if any(word in line for word in telling)]
    return "\n".join(lines[-40:])[-3000:] + "\n--- the end ---\n" + stderr[-2000:]


def logged_losses(output_dir: Path) -> list[float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def test_fsdp_on_two_processes_follows_one_process_and_writes_hub_folders(tmp_path):
    """2 FSDP processes x max_tokens B == 1 process x B x 2 accumulation steps (same batches, loss over
    all target tokens): the same losses and weights. Every checkpoint is a Hub folder like one process's
    (no torch files as remote code, the tied matrix stored once), loads with from_pretrained, and the
    final model is the mean of the last two, as the averaging tool computes it from those folders. Both
    processes leave main() with the process group closed."""
    data = tmp_path / "data"
    data.mkdir()
    train_files = write_reversal_task(data, "train", 1500, seed=1)
    valid_files = write_reversal_task(data, "valid", 24, seed=2)  # 24 = 3 steps x 4 sentences x 2 processes
    tokenizer_dir = tmp_path / "tokenizer"
    common = [
        "--train_source_file",
        train_files[0],
        "--train_target_file",
        train_files[1],
        "--validation_source_file",
        valid_files[0],
        "--validation_target_file",
        valid_files[1],
        "--test_source_file",
        valid_files[0],
        "--test_target_file",
        valid_files[1],
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--preset",
        "tiny",
        "--config_overrides",
        "dropout=0.0",
        "--tokenizer_name_or_path",
        str(tokenizer_dir),
        "--max_steps",
        "6",
        "--max_tokens",
        "150",
        "--learning_rate",
        "0.003",
        "--warmup_steps",
        "3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--average_checkpoints",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--generation_num_beams",
        "1",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
    ]
    train.build_trainer(
        *train.parse_arguments(
            [
                *common[:4],
                "--preset",
                "tiny",
                "--tokenizer_vocab_size",
                "270",
                "--output_dir",
                str(tmp_path / "t"),
                "--use_cpu",
            ]
        )
    ).tokenizer.save_pretrained(tokenizer_dir)

    one = tmp_path / "one"
    one_metrics = train.main([*common, "--output_dir", str(one), "--gradient_accumulation_steps", "2"])

    sharded = tmp_path / "fsdp"
    script = REPO / "tests" / "fsdp_on_cpu.py"
    completed = launch_on_two_processes(FSDP_CONFIG, script, [*common, "--output_dir", str(sharded)])
    assert "process 1 of 2" in completed.stderr
    assert (sharded / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()  # written only by FSDP's checkpointing
    # each process left main() with its process group closed (an open one can abort it at exit)
    for rank in (0, 1):
        assert (sharded / f"process_group_open_after_main.rank{rank}").read_text() == "False"

    assert logged_losses(sharded) == pytest.approx(logged_losses(one), rel=1e-3)
    checkpoints = ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert sorted(p.name for p in sharded.glob("checkpoint-*")) == checkpoints
    for name in checkpoints:
        folder, reference = sharded / name, one / name
        assert sorted(p.name for p in folder.glob("*.py")) == sorted(p.name for p in reference.glob("*.py"))
        weights, reference_weights = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
        assert weights.keys() == reference_weights.keys()  # the shared matrix once, as save_pretrained stores it
        for key in weights.keys() - noise_only(weights):
            torch.testing.assert_close(weights[key], reference_weights[key], rtol=1e-3, atol=1e-5, msg=key)
        AutoModelForSeq2SeqLM.from_pretrained(folder)

    average_checkpoints([sharded / "checkpoint-4", sharded / "checkpoint-6"], tmp_path / "averaged")
    final, averaged = load_file(sharded / "model.safetensors"), load_file(tmp_path / "averaged" / "model.safetensors")
    last = [load_file(sharded / name / "model.safetensors") for name in checkpoints[1:]]
    for key in final:
        mean = ((last[0][key].double() + last[1][key].double()) / 2).float()
        torch.testing.assert_close(final[key], mean)
        torch.testing.assert_close(averaged[key], mean)

    # evaluated and translated with the averaged weights, as one process does
    metrics = json.loads((sharded / "all_results.json").read_text())
    assert metrics["eval_loss"] == pytest.approx(one_metrics["eval_loss"], rel=1e-3)
    assert metrics["predict_samples"] == 24
    assert (sharded / train.PREDICTIONS_FILE).read_text() == (one / train.PREDICTIONS_FILE).read_text()


def test_fsdp_trains_sharded_after_evaluating_first(tmp_path):
    """A script that calls trainer.evaluate() before trainer.train(), on 2 FSDP processes: the evaluation
    prepares the model unsharded, and training must still shard it (FSDP's own checkpoint files) and
    follow one process with the same batches, which evaluates and trains the same way."""
    data = tmp_path / "data"
    data.mkdir()
    train_files = write_reversal_task(data, "train", 1500, seed=1)
    valid_files = write_reversal_task(data, "valid", 23, seed=2)
    tokenizer_dir = tmp_path / "tokenizer"
    common = [
        "--train_source_file",
        train_files[0],
        "--train_target_file",
        train_files[1],
        "--validation_source_file",
        valid_files[0],
        "--validation_target_file",
        valid_files[1],
        "--preset",
        "tiny",
        "--config_overrides",
        "dropout=0.0",
        "--tokenizer_name_or_path",
        str(tokenizer_dir),
        "--max_steps",
        "4",
        "--max_tokens",
        "150",
        "--learning_rate",
        "0.003",
        "--warmup_steps",
        "3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--per_device_eval_batch_size",
        "4",
        "--generation_num_beams",
        "1",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
    ]
    train.build_trainer(
        *train.parse_arguments(
            [
                *common[:4],
                "--preset",
                "tiny",
                "--tokenizer_vocab_size",
                "270",
                "--output_dir",
                str(tmp_path / "t"),
                "--use_cpu",
            ]
        )
    ).tokenizer.save_pretrained(tokenizer_dir)

    one = tmp_path / "one"
    reference = train.build_trainer(
        *train.parse_arguments([*common, "--output_dir", str(one), "--gradient_accumulation_steps", "2"])
    )
    one_before = reference.trainer.evaluate()
    reference.trainer.train()
    reference.trainer.save_state()

    sharded = tmp_path / "fsdp"
    script = REPO / "tests" / "fsdp_evaluate_then_train.py"
    launch_on_two_processes(FSDP_CONFIG, script, [*common, "--output_dir", str(sharded)])
    before = json.loads((sharded / "evaluation_before_training.json").read_text())
    for name in ("eval_loss", "eval_bleu", "eval_gen_len"):
        assert before[name] == pytest.approx(one_before[name], rel=1e-5), name
    assert (sharded / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()  # written only by FSDP's checkpointing
    assert logged_losses(sharded) == pytest.approx(logged_losses(one), rel=1e-3)
    assert len(logged_losses(one)) == 4


# FSDP evaluates unwrapped, as DDP does; its evaluation also runs in test_fsdp_trains_sharded_after_evaluating_first
@pytest.mark.parametrize("launch", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_evaluation_alone_on_two_processes_scores_every_sentence_once(launch, tmp_path):
    """Evaluation and prediction without training, on 2 processes, of 23 sentences: a number no batch
    layout divides (2 processes x 4 sentences). accelerate pads the last batches with repeated sentences
    and `gather_for_metrics` must drop them: BLEU, chrF and output lengths equal one process's, the
    predictions too, line for line, and every sentence is translated once."""
    data = tmp_path / "data"
    data.mkdir()
    train_files = write_reversal_task(data, "train", 600, seed=1)
    valid_files = write_reversal_task(data, "valid", 23, seed=2)
    model_dir = tmp_path / "model"
    train.main(
        [  # a model that has learnt something, so that its translations differ between sentences
            "--train_source_file",
            train_files[0],
            "--train_target_file",
            train_files[1],
            "--do_train",
            "--preset",
            "tiny",
            "--tokenizer_vocab_size",
            "270",
            "--max_steps",
            "150",
            "--max_tokens",
            "300",
            "--learning_rate",
            "0.003",
            "--warmup_steps",
            "5",
            "--save_strategy",
            "no",
            "--average_checkpoints",
            "0",
            "--output_dir",
            str(model_dir),
            "--report_to",
            "none",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    common = [
        "--model_name_or_path",
        str(model_dir),
        "--do_eval",
        "--do_predict",
        "--validation_source_file",
        valid_files[0],
        "--validation_target_file",
        valid_files[1],
        "--test_source_file",
        valid_files[0],
        "--test_target_file",
        valid_files[1],
        "--per_device_eval_batch_size",
        "4",
        "--generation_num_beams",
        "4",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
    ]
    one = tmp_path / "one"
    train.main([*common, "--output_dir", str(one)])

    two = tmp_path / launch
    script = REPO / ("tests/fsdp_on_cpu.py" if launch == "fsdp" else "tests/train_launched.py")
    config = FSDP_CONFIG if launch == "fsdp" else REPO / "training" / "accelerate" / "ddp.yaml"
    completed = launch_on_two_processes(config, script, [*common, "--output_dir", str(two)])
    assert "process 1 of 2" in completed.stderr

    metrics, one_metrics = (json.loads((folder / "all_results.json").read_text()) for folder in (two, one))
    assert metrics["predict_samples"] == one_metrics["predict_samples"] == 23
    assert one_metrics["eval_bleu"] > 5  # translations worth comparing
    for name in ("eval_bleu", "eval_chrf", "eval_gen_len", "predict_bleu"):  # a repeated sentence would move each
        assert metrics[name] == pytest.approx(one_metrics[name], abs=1e-6), name
    # the NLL per token of the 23 sentences, whatever the batches (the Trainer's own mean of batch means
    # gave 0.5505 on 2 processes against 0.5566 on one)
    assert metrics["eval_loss"] == pytest.approx(one_metrics["eval_loss"], rel=1e-5)
    predictions = (two / train.PREDICTIONS_FILE).read_text().splitlines()
    assert predictions == (one / train.PREDICTIONS_FILE).read_text().splitlines() and len(predictions) == 23


WAITS_FOR_THE_FIRST = """
import datetime, sys, time
import launched
import torch.distributed as dist
from vanilla_transformer.training import TransformerTrainingArguments
# the training's process group with a --ddp_timeout of seconds, as transformers makes it on a GPU (on the CPU it
# leaves the timeout out), taken over by the arguments; set once both processes are there (a loaded machine
# starts them seconds apart)
timeout = int(sys.argv[2])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
dist.barrier()
dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout))
args = TransformerTrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to="none", ddp_timeout=timeout)
assert args.world_size == 2
with args.main_process_first(desc="reading the data"):
    if args.process_index == 0:
        time.sleep(3 * args.ddp_timeout)  # a first run's preparation of a large corpus
print(f"process {args.process_index} past the preparation", flush=True)
launched.leave()  # tests/launched.py: past the interpreter's shutdown, where gloo's threads can abort a process
"""


def test_processes_wait_for_the_first_ones_data_preparation_past_the_ddp_timeout(tmp_path):
    """The first run of a corpus prepares it in the first process while the others wait: they waited in a barrier of
    the training's process group, which fails after --ddp_timeout (30 minutes by default; WMT14 en-fr's 36M pairs
    can take longer). Here a 1 s timeout and a 3 s preparation."""
    port = free_port()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WAITS_FOR_THE_FIRST, str(tmp_path), "1"],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=240)[0] for process in processes]
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0 and f"process {rank} past the preparation" in output, output[-3000:]
