"""Out of memory at once (vanilla_transformer.training.memory_check), simulated on the CPU: the model's
forward raises torch.OutOfMemoryError when a training batch holds more than a number of tokens, as a
device with that much memory would. The references: the batch shapes TokenBatchSampler makes for each
--max_tokens, and that simulated limit; the weights before the probe or a skipped batch."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from test_faults import MAX_STEPS, SAVE_STEPS, data_dir, run_argv  # noqa: F401 (fixture)
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import run as train
from vanilla_transformer.training.batching import TokenBatchSampler
from vanilla_transformer.training.data import example_lengths
from vanilla_transformer.training.memory_check import MemoryCheckError, check_largest_batches_fit
from vanilla_transformer.training.trainer import TransformerTrainingArguments

MAX_TOKENS = 200  # run_argv's


class SimulatedMemory:
    """Patch the model's forward: a training batch of more than ``limit`` tokens (both sides) runs out."""

    def __init__(self, monkeypatch, limit: int, error=torch.OutOfMemoryError):
        self.limit, self.raised = limit, 0
        original = VanillaTransformerForConditionalGeneration.forward

        @functools.wraps(original)  # the Trainer keeps the dataset columns that forward's signature names
        def forward(model, *args, **kwargs):
            tokens = kwargs["input_ids"].numel() + kwargs["decoder_input_ids"].numel()
            if model.training and tokens > self.limit:
                self.raised += 1
                raise error(f"simulated: {tokens} tokens do not fit in {self.limit}")
            return original(model, *args, **kwargs)

        monkeypatch.setattr(VanillaTransformerForConditionalGeneration, "forward", forward)


def build(data_dir, output_dir, *extra) -> train.Run:
    return train.build_trainer(*train.parse_arguments(run_argv(data_dir, output_dir, *extra)))


def most_tokens(lengths: np.ndarray, max_tokens: int) -> int:
    """The most tokens (both sides, padded) in one batch of --max_tokens: from the sampler's shapes."""
    shapes = TokenBatchSampler(lengths[lengths.max(axis=1) <= max_tokens], max_tokens).shapes
    return int((shapes[:, 0] * (shapes[:, 1] + shapes[:, 2])).max())


@pytest.fixture
def probed(data_dir, tmp_path):
    run = build(data_dir, tmp_path / "run", "--memory_probe", "on")
    return run, example_lengths(run.trainer.train_dataset)


def test_the_largest_bucket_that_runs_out_names_its_shape_and_a_max_tokens_that_fits(probed, monkeypatch):
    run, lengths = probed
    limit = most_tokens(lengths, MAX_TOKENS) - 1  # the fullest batch runs out, every other one fits
    fitting, accumulation = MAX_TOKENS // 2, 2
    while most_tokens(lengths, fitting) > limit:
        fitting, accumulation = fitting // 2, accumulation * 2
    SimulatedMemory(monkeypatch, limit)
    before = {name: p.detach().clone() for name, p in run.trainer.model.named_parameters()}
    with pytest.raises(MemoryCheckError) as refused:
        check_largest_batches_fit(run.trainer)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"the largest of --max_tokens {MAX_TOKENS}" in message
    rows, source, target = (int(size) for size in message.split("a batch of ")[1].split(" (rows")[0].split(" x "))
    shapes = {tuple(shape) for shape in TokenBatchSampler(lengths, MAX_TOKENS).shapes.tolist()}
    assert (rows, source, target) in shapes and rows * (source + target) > limit
    assert f"--max_tokens {fitting} fits" in message and f"--gradient_accumulation_steps {accumulation}" in message
    for name, p in run.trainer.model.named_parameters():  # nothing trained, no gradient left behind
        assert torch.equal(p, before[name]) and p.grad is None, name


@pytest.mark.parametrize(
    "message, taken",
    [
        ("CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
        ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
        ("CUDA error: out of memory", True),
        ("expected scalar type Float but found Half", False),
    ],
    ids=["cublas", "cudnn", "cuda", "not-memory"],
)
def test_a_librarys_allocation_failure_counts_as_running_out_of_memory(probed, monkeypatch, message, taken):
    """cuBLAS and cuDNN report a failed allocation as a RuntimeError, not torch's OutOfMemoryError; the probe
    takes them for running out of memory (a --max_tokens that fits), and any other error for what it is."""
    run, lengths = probed

    def runtime_error(text):
        return RuntimeError(f"{message} ({text})")

    SimulatedMemory(monkeypatch, most_tokens(lengths, MAX_TOKENS) - 1, error=runtime_error)
    with pytest.raises(MemoryCheckError if taken else RuntimeError, match=None if taken else "expected scalar"):
        check_largest_batches_fit(run.trainer)


def test_a_probe_that_fits_changes_no_weight_and_no_random_stream(probed):
    run, _ = probed
    before = {name: p.detach().clone() for name, p in run.trainer.model.named_parameters()}
    random_state = torch.random.get_rng_state()
    check_largest_batches_fit(run.trainer)
    assert torch.equal(torch.random.get_rng_state(), random_state)
    for name, p in run.trainer.model.named_parameters():
        assert torch.equal(p, before[name]) and p.grad is None, name


@pytest.mark.parametrize("fused_loss", ["none", "chunked"])
def test_the_probe_takes_the_runs_own_loss(data_dir, tmp_path, fused_loss):
    """With --fused_loss the probe runs the fused pass, which never computes the full logits (the pre-softmax
    projection as a module): a --max_tokens that fits only thanks to it is not refused."""
    run = build(data_dir, tmp_path / "run", "--memory_probe", "on", "--fused_loss", fused_loss)
    model = run.trainer.accelerator.unwrap_model(run.trainer.model)
    full_logits = []
    model.lm_head.register_forward_hook(lambda module, inputs, output: full_logits.append(output.shape))
    check_largest_batches_fit(run.trainer)
    assert bool(full_logits) == (fused_loss == "none"), full_logits


def test_on_the_cpu_the_probe_is_off_unless_asked(data_dir, tmp_path, monkeypatch):
    run = build(data_dir, tmp_path / "run")  # --memory_probe auto
    SimulatedMemory(monkeypatch, 0)
    check_largest_batches_fit(run.trainer)  # tries nothing


def test_a_run_whose_largest_bucket_runs_out_exits_2_before_the_first_update(data_dir, tmp_path, monkeypatch, capsys):
    SimulatedMemory(monkeypatch, 1)  # no batch fits
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train.main(run_argv(data_dir, output, "--memory_probe", "on"), exit_on_bad_input=True)
    error = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1, error
    assert error.startswith("vanilla-transformer train: error: a batch of ") and "runs out of cpu memory" in error
    assert "every --max_tokens down to" in error
    assert not list(output.glob("checkpoint-*")) and not (output / "trainer_state.json").exists()


def test_without_skipping_a_batch_that_runs_out_of_memory_ends_training(data_dir, tmp_path, monkeypatch):
    run = build(data_dir, tmp_path / "run")
    SimulatedMemory(monkeypatch, 1)
    with pytest.raises(torch.OutOfMemoryError):
        run.trainer.train()


def test_skipped_batches_change_no_weight_and_are_counted_in_the_logs(data_dir, tmp_path, monkeypatch):
    run = build(data_dir, tmp_path / "run", "--skip_oom_batches", "--save_strategy", "no")
    before = {name: p.detach().clone() for name, p in run.trainer.model.named_parameters()}
    memory = SimulatedMemory(monkeypatch, 1)  # every batch runs out
    run.trainer.train()
    assert memory.raised == MAX_STEPS
    logged = [entry["skipped_oom_batches"] for entry in run.trainer.state.log_history if "skipped_oom_batches" in entry]
    assert logged[-1] == MAX_STEPS and logged[0] == 1  # logging_steps 1: one more each update
    for name, p in run.trainer.model.named_parameters():  # Adam leaves a weight without a gradient as it is
        assert torch.equal(p, before[name]), name


def logged_skips(trainer) -> list[int]:
    """The count each update's log gives (logging_steps 1)."""
    return [entry["skipped_oom_batches"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("fused_loss", ["none", "chunked"])
def test_a_skipped_batchs_target_tokens_are_not_counted_as_trained_on(data_dir, tmp_path, monkeypatch, fused_loss):
    """A batch that runs out of memory in its backward pass (where most do) was already counted by compute_loss;
    the throughput must not claim it. The reference: every batch skipped, so nothing was trained on."""
    run = build(data_dir, tmp_path / "run", "--skip_oom_batches", "--save_strategy", "no", "--fused_loss", fused_loss)

    def backward(loss, **kwargs):
        raise torch.OutOfMemoryError("simulated: the backward pass ran out")

    monkeypatch.setattr(run.trainer.accelerator, "backward", backward)
    metrics = run.trainer.train().metrics
    assert run.trainer.skipped_oom_batches == MAX_STEPS
    assert metrics["train_target_tokens"] == 0 and metrics["train_samples_per_second"] == 0, metrics


def test_the_count_of_skipped_batches_goes_on_across_a_resume(data_dir, tmp_path, monkeypatch):
    """skipped_oom_batches is the whole run's: a resumed run (a requeued job) goes on from the checkpoint's count."""
    output = tmp_path / "run"
    first = build(data_dir, output, "--skip_oom_batches", "--max_steps", str(SAVE_STEPS))
    SimulatedMemory(monkeypatch, 1)  # every batch runs out
    first.trainer.train()
    assert logged_skips(first.trainer)[-1] == SAVE_STEPS
    checkpoint = str(output / f"checkpoint-{SAVE_STEPS}")
    resumed = build(
        data_dir,
        output,
        "--skip_oom_batches",
        "--max_steps",
        str(2 * SAVE_STEPS),
        "--resume_from_checkpoint",
        checkpoint,
    )
    resumed.trainer.train(resume_from_checkpoint=checkpoint)
    after = logged_skips(resumed.trainer)[-SAVE_STEPS:]  # the log history goes on from the checkpoint's too
    assert after == list(range(SAVE_STEPS + 1, 2 * SAVE_STEPS + 1)), after
    assert resumed.trainer.skipped_oom_batches == 2 * SAVE_STEPS


def test_memory_probe_takes_auto_on_or_off(data_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match="--memory_probe must be one of auto, on, off"):  # from Python
        TransformerTrainingArguments(output_dir=str(tmp_path), memory_probe="sometimes")
    with pytest.raises(SystemExit) as exit_info:  # on the command line
        train.main(run_argv(data_dir, tmp_path / "run", "--memory_probe", "sometimes"), exit_on_bad_input=True)
    assert exit_info.value.code == 2 and "--memory_probe" in capsys.readouterr().err


def test_skipping_batches_under_fp16s_loss_scaler_is_refused_before_anything_runs(tmp_path):
    """An update whose only batch was skipped has no gradients (set to None), and the loss scaler of --fp16
    (torch's GradScaler, which accelerate steps the optimizer through) refuses to step such an optimizer."""
    model = torch.nn.Linear(2, 2)
    optimizer, scaler = torch.optim.Adam(model.parameters()), torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()  # an update as any other
    scaler.step(optimizer), scaler.update()
    model.zero_grad(set_to_none=True)  # then one whose batches were all skipped
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.step(optimizer)
    with pytest.raises(ValueError, match="--skip_oom_batches with --fp16.*--bf16"):
        TransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fp16=True, skip_oom_batches=True)


def test_skipping_batches_on_several_processes_is_refused_before_any_data_is_read(data_dir, tmp_path, monkeypatch):
    """Refused when training began, after the data was read, the tokenizer trained and the data tokenized."""
    monkeypatch.setenv("WORLD_SIZE", "2")  # as accelerate launch sets it for each process
    monkeypatch.setattr(train, "load_text_datasets", lambda *a, **k: pytest.fail("the data was read first"))
    with pytest.raises(ValueError, match="--skip_oom_batches works in one process only"):
        train.main(run_argv(data_dir, tmp_path / "run", "--skip_oom_batches"))
