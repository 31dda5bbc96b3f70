"""A diverging run stops loudly and saves nothing of what it diverged to (`training.divergence`).

A learning rate of 1e10 with a one-update warm-up makes the tiny model's loss nan at its second
update (the first runs on the initial weights); the reference for "the last finite loss" is the
Trainer's own log of that first update, written into the checkpoint saved after it. That detection
adds no host-device synchronisation per update is checked by recording every read of a tensor's
value made from the guard's module, update by update.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DataCollatorForSeq2Seq

from test_faults import REPO, reverse_pairs
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer
from vanilla_transformer.training import TransformerTrainer, TransformerTrainingArguments, divergence, tokenize_dataset
from vanilla_transformer.training import run as train
from vanilla_transformer.training.checkpointing import STAGING_DIR, check_resumable
from vanilla_transformer.training.divergence import DivergenceGuard, TrainingDiverged

DIVERGING = ("--learning_rate", "1e10", "--warmup_steps", "1")  # update 2 runs on nan weights


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("divergence")
    pairs = reverse_pairs(200, seed=2)
    (folder / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return folder


def argv(data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--train_file",
        str(data_dir / "train.tsv"),
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "280",
        "--output_dir",
        str(output_dir),
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--eval_strategy",
        "no",
        "--max_tokens",
        "200",
        "--save_strategy",
        "steps",
        "--cache_dir",
        str(data_dir / "cache"),
        *extra,
    ]


def is_finite(tensors: dict) -> bool:
    return all(torch.isfinite(t).all() for t in tensors.values())


def test_train_py_stops_at_the_first_check_naming_the_update_and_keeping_the_last_good_checkpoint(data_dir, tmp_path):
    output = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as diverged:
        train.main(
            argv(
                data_dir,
                output,
                *DIVERGING,
                "--max_steps",
                "6",
                "--save_steps",
                "1",
                "--logging_steps",
                "1",
                "--ema_decay",
                "0.9",
            )
        )
    message = str(diverged.value)
    good = output / "checkpoint-1"
    logged = json.loads((good / "trainer_state.json").read_text())["log_history"][0]
    assert logged["step"] == 1 and math.isfinite(logged["loss"])
    assert "\n" not in message
    assert message.startswith(
        f"Training diverged at update 2: the loss is nan (last finite loss {logged['loss']:.4g}, "
        "at update 1). Likely causes: too high a learning rate"
    )
    assert "float16 overflow" in message and "bad batch" in message
    assert f"The last good checkpoint, {good}, is intact" in message and f"--resume_from_checkpoint {good}" in message
    assert diverged.value.update == 2 and diverged.value.last_finite_loss == pytest.approx(logged["loss"])
    # Nothing after update 1 was written: no checkpoint, no half-written one, no final model.
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-1"]
    assert not (output / STAGING_DIR).exists() and not (output / "model.safetensors").exists()
    check_resumable(good)
    assert is_finite(load_file(good / "model.safetensors")) and is_finite(load_file(good / "ema.safetensors"))


def test_a_run_continued_in_a_new_folder_is_pointed_to_the_checkpoint_it_began_at(data_dir, tmp_path):
    """A run resumed into a new --output_dir that diverges before its first save there was told that no
    checkpoint was saved and to start again: the one it continued from, in the first folder, is still good."""
    first, second = tmp_path / "first", tmp_path / "second"
    train.main(argv(data_dir, first, *DIVERGING, "--max_steps", "1", "--save_steps", "1"))
    good = first / "checkpoint-1"
    check_resumable(good)
    with pytest.raises(TrainingDiverged) as diverged:
        train.main(
            argv(data_dir, second, *DIVERGING, "--max_steps", "6", "--save_steps", "1", "--resume_from_checkpoint")
            + [str(good)]
        )
    message = str(diverged.value)
    assert diverged.value.update == 2 and not list(second.glob("checkpoint-*"))
    assert f"The last good checkpoint, {good}, is intact" in message, message


def test_training_train_py_exits_with_the_error_and_no_model(data_dir, tmp_path):
    output = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "training/train.py"),
            *argv(data_dir, output, *DIVERGING, "--max_steps", "3", "--save_steps", "1", "--logging_steps", "1"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    last = completed.stderr.strip().splitlines()[-1]  # the message, as the command's error
    assert ": error: Training diverged at update 2: the loss is nan (last finite loss " in last
    assert not (output / "model.safetensors").exists()
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-1"]


def test_a_divergence_between_checks_is_named_by_its_update_and_nothing_is_saved(data_dir, tmp_path):
    output = tmp_path / "run"
    with pytest.raises(
        TrainingDiverged,
        match=r"^Training diverged at update 2: the loss is nan \(last finite loss "
        r".*, at update 1\).* No checkpoint was saved before it",
    ):
        train.main(argv(data_dir, output, *DIVERGING, "--max_steps", "8", "--save_steps", "5", "--logging_steps", "5"))
    assert not list(output.glob("checkpoint-*")) and not (output / "model.safetensors").exists()


def users_own_trainer(data_dir: Path, output_dir: Path, **arguments) -> TransformerTrainer:
    """A script of the user's own, as the README's "Your own Trainer script": no run.py involved."""
    from datasets import Dataset

    pairs = [line.split("\t") for line in (data_dir / "train.tsv").read_text(encoding="utf-8").splitlines()]
    tokenizer = train_tokenizer((text for pair in pairs for text in pair), vocab_size=280)
    text = Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    data = tokenize_dataset(text, tokenizer)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer))
    model = VanillaTransformerForConditionalGeneration(config)
    args = TransformerTrainingArguments(
        output_dir=str(output_dir), max_tokens=200, report_to="none", use_cpu=True, disable_tqdm=True, **arguments
    )
    return TransformerTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )


def test_a_users_own_script_stops_and_cannot_save_the_diverged_model(data_dir, tmp_path):
    output = tmp_path / "mine"
    trainer = users_own_trainer(
        data_dir, output, max_steps=6, learning_rate=1e10, warmup_steps=1, save_steps=3, logging_steps=100
    )
    with pytest.raises(TrainingDiverged, match=r"^Training diverged at update 2: the loss is nan"):
        trainer.train()
    assert not list(output.glob("checkpoint-*"))  # the save at update 3 came after the divergence
    # A script that catches the error and saves anyway is refused too: the weights are nan.
    with pytest.raises(TrainingDiverged, match=r"the model to save in .*mine holds non-finite values"):
        trainer.save_model()
    assert not (output / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# No host-device synchronisation per update
# ---------------------------------------------------------------------------------------------

TORCH_DIR = str(Path(torch.__file__).parent)
READING_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__")


@contextmanager
def reads_from(module_file: str, clock):
    """Counts, by ``clock()`` (the update), every read of a tensor's value made from ``module_file``:
    Tensor methods that copy to the host, and ``aten._local_scalar_dense``, which every scalar read
    (``.item()``, ``bool``, ``float``) dispatches to."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = Counter()

    def from_module() -> bool:  # the first caller outside torch (and this instrument) is the module
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith((TORCH_DIR, __file__)):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_filename == module_file

    def counting(name, method):
        def read(self, *args, **kwargs):
            if from_module():
                reads[clock()] += 1
            return method(self, *args, **kwargs)

        return read

    class ScalarReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and from_module():
                reads[clock()] += 1
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in READING_METHODS}
    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(name, method))
    try:
        with ScalarReads():
            yield reads
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def test_the_guard_reads_the_device_only_at_logging_steps(data_dir, tmp_path):
    """Updates 1-8, logging every 4th: the guard reads values at updates 4 and 8 only (the reads of
    update n happen at the end of update n, before the clock moves)."""
    trainer = train.build_trainer(
        *train.parse_arguments(
            argv(
                data_dir,
                tmp_path / "run",
                "--max_steps",
                "8",
                "--logging_steps",
                "4",
                "--save_strategy",
                "no",
                "--learning_rate",
                "0.003",
                "--warmup_steps",
                "4",
            )
        )
    ).trainer
    with reads_from(divergence.__file__, lambda: trainer.state.global_step) as reads:
        trainer.train()
    assert sorted(reads) == [4, 8], reads


def test_the_instrument_sees_a_read_from_the_module():
    """The counter above is not blind: a plain .item() and a bool() made from the module are counted."""
    flag = torch.ones(())
    with reads_from(divergence.__file__, lambda: "now") as reads:
        divergence.non_finite({"x": flag})
    assert reads["now"] >= 1


# ---------------------------------------------------------------------------------------------
# float16's loss scaler: a skipped update is normal and counted; a collapsing scale is divergence
# ---------------------------------------------------------------------------------------------


class Float16Accelerator:
    """What the guard asks of accelerate's Accelerator under --fp16 on a GPU: whether the loss scaler
    skipped the last optimizer step (a host flag), and the scale (``GradScaler.get_scale``)."""

    def __init__(self, scale: float = 2.0**16):
        self.num_processes, self.optimizer_step_was_skipped = 1, False
        self.scaler = type("Scaler", (), {"get_scale": lambda _: self.scale})()
        self.scale = scale


def guard_under_float16(tmp_path) -> DivergenceGuard:
    trainer = type("Trainer", (), {})()
    trainer.accelerator = Float16Accelerator()
    trainer.args = type("Args", (), {"output_dir": str(tmp_path), "device": torch.device("cpu")})()
    guard = DivergenceGuard(trainer)
    guard.on_train_begin(trainer.args, type("State", (), {"global_step": 0})(), None)
    return guard


def update(guard: DivergenceGuard, loss: float, grad_norm: float, skipped: bool = False) -> None:
    guard.trainer.accelerator.optimizer_step_was_skipped = skipped
    guard.add_loss(torch.tensor(loss))
    guard.add_grad_norm(torch.tensor(grad_norm))
    guard._fold_update()


def test_updates_the_loss_scaler_skips_are_counted_not_divergence(tmp_path):
    guard = guard_under_float16(tmp_path)
    update(guard, 5.0, 2.0)
    update(guard, 4.0, math.inf, skipped=True)  # the gradients overflowed float16: the scaler skipped it
    update(guard, math.nan, math.nan, skipped=True)
    update(guard, 3.5, 1.0)
    guard.trainer.accelerator.scale = 2.0**13
    guard.check(4)
    assert guard.skipped == 2
    update(guard, 3.0, math.inf)  # not skipped, yet not finite: the weights took it
    with pytest.raises(
        TrainingDiverged,
        match=r"^Training diverged at update 5: the gradient norm is inf \(loss 3\) "
        r"\(last finite loss 3.5, at update 4\)",
    ):
        guard.check(5)


def test_a_loss_scale_below_the_minimum_is_divergence(tmp_path):
    guard = guard_under_float16(tmp_path)
    update(guard, 5.0, 2.0)
    for _ in range(3):
        update(guard, math.nan, math.nan, skipped=True)
    guard.trainer.accelerator.scale = divergence.MIN_LOSS_SCALE / 2
    with pytest.raises(
        TrainingDiverged,
        match=r"^Training diverged at update 4: the float16 loss scale fell to "
        r"5e-05, below 0.0001, after 3 skipped updates.*last finite loss 5, "
        r"at update 1",
    ):
        guard.check(4)


def test_the_log_counts_the_skipped_updates_under_a_loss_scaler(data_dir, tmp_path):
    trainer = users_own_trainer(data_dir, tmp_path / "mine", max_steps=1)
    trainer.log({"loss": 1.0})
    assert "skipped_updates" not in trainer.state.log_history[-1]  # no scaler (float32): nothing to count
    trainer.accelerator.scaler, trainer.divergence.skipped = Float16Accelerator().scaler, 3
    trainer.log({"loss": 1.0})
    assert trainer.state.log_history[-1]["skipped_updates"] == 3


def test_a_checkpoint_of_non_finite_weights_is_refused_even_after_finite_losses(data_dir, tmp_path):
    """Weights can turn non-finite in the optimizer with every loss and gradient norm finite: the check
    before a checkpoint reads the weights too, and names one."""
    trainer = users_own_trainer(
        data_dir, tmp_path / "mine", max_steps=2, save_steps=2, learning_rate=1e-3, warmup_steps=1
    )

    class PoisonTheWeights(train.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 2:
                with torch.no_grad():
                    model.get_parameter("model.encoder.layers.0.self_attention.q_proj.weight")[0, 0] = math.inf

    trainer.callback_handler.callbacks.insert(0, PoisonTheWeights())
    with pytest.raises(
        TrainingDiverged,
        match=r"^Training diverged by update 2: the weights hold non-finite values "
        r"\(e\.g\. model\.encoder\.layers\.0\.self_attention\.q_proj\.weight\) "
        r"although every loss",
    ):
        trainer.train()
    assert not list((tmp_path / "mine").glob("checkpoint-*"))
