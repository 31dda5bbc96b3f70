"""What a run says while it trains: progress by the clock when the budget is in minutes, the loss, and
throughput in target tokens per second (what §5.1's batches are made of).

The Trainer's own bar counts updates out of ``max_steps``; with ``--max_train_minutes`` the updates are
unknown (the Multi30k recipe sets ``max_steps`` 1,000,000 as a mere bound) and it would show
``0/1000000`` with an ETA of days. Its ``train_samples_per_second`` multiplies the updates by
``per_device_train_batch_size``, which token batches (``--max_tokens``) ignore.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm
from transformers import ProgressCallback

REFRESH_SECONDS = 1.0  # the bar reads the device's token count at most this often


class TargetTokens:
    """Target tokens (labels other than -100) and sentences trained on, counted on the device: no sync per batch."""

    def __init__(self):
        self.tokens: torch.Tensor | None = None
        self.sentences = 0

    def reset(self) -> None:
        self.tokens, self.sentences = None, 0

    def add(self, labels: torch.Tensor) -> None:
        count = (labels != -100).sum()
        self.tokens = count if self.tokens is None else self.tokens + count
        self.sentences += labels.shape[0]

    def counted(self) -> tuple[torch.Tensor | None, int]:
        """The counts so far, for `restore` to go back to (a batch skipped after it was counted)."""
        return self.tokens, self.sentences

    def restore(self, counted: tuple[torch.Tensor | None, int]) -> None:
        self.tokens, self.sentences = counted

    def local(self) -> int:
        return 0 if self.tokens is None else int(self.tokens.item())

    def totals(self, accelerator) -> tuple[int, int]:
        """(target tokens, sentences) of every process together; a collective: every process calls it. Counts as
        int64 (Apple's MPS has no float64), on the device only where processes add them up."""
        if accelerator.num_processes == 1:
            return self.local(), self.sentences
        counts = torch.tensor([self.local(), self.sentences], dtype=torch.int64, device=accelerator.device)
        total = accelerator.reduce(counts, reduction="sum")
        return int(total[0].item()), int(total[1].item())


def add_throughput(logs: dict, counter: TargetTokens, accelerator) -> None:
    """The end of training's log (and train()'s metrics, the same dict) with the sentences and target tokens
    actually trained on, per second."""
    tokens, sentences = counter.totals(accelerator)
    runtime = max(logs["train_runtime"], 1e-9)
    logs.update(
        train_samples_per_second=round(sentences / runtime, 3),
        train_target_tokens=tokens,
        train_target_tokens_per_second=round(tokens / runtime, 1),
    )


class TimeBudgetProgress(ProgressCallback):
    """The training bar of a run with a budget in minutes: minutes done out of the budget, updates, the last
    logged loss and target tokens per second (this process's count times the number of processes)."""

    def __init__(
        self, max_minutes: float, counter: TargetTokens, processes: int = 1, minutes_before: Callable[[], float] = None
    ):
        """``minutes_before``: read when training begins, the minutes of the budget a resumed run trained before
        (`WallClock`'s, which runs first): the bar goes on from there, as the budget does."""
        super().__init__()
        self.max_minutes, self.counter, self.processes = max_minutes, counter, processes
        self.minutes_before = minutes_before or (lambda: 0.0)
        self.loss = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.current_step, self.start, self.refreshed = 0, time.monotonic(), 0.0
        self.start_tokens = self.counter.local()
        self.before = min(self.minutes_before(), self.max_minutes)
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                initial=self.before,
                total=self.max_minutes,
                unit="min",
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:g} min [{elapsed}<{remaining}{postfix}]",
            )

    def on_step_end(self, args, state, control, **kwargs):
        self.current_step = state.global_step
        now = time.monotonic()
        if not state.is_world_process_zero or now - self.refreshed < REFRESH_SECONDS:
            return
        self.refreshed, elapsed = now, now - self.start
        tokens_per_second = (self.counter.local() - self.start_tokens) * self.processes / max(elapsed, 1e-9)
        postfix = {"update": state.global_step, "tok/s": f"{tokens_per_second:,.0f}"}
        if self.loss is not None:
            postfix["loss"] = f"{self.loss:.3f}"
        self.training_bar.set_postfix(postfix, refresh=False)
        self.training_bar.update(min(self.before + elapsed / 60, self.max_minutes) - self.training_bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.loss = logs["loss"]
        super().on_log(args, state, control, logs=logs, **kwargs)
