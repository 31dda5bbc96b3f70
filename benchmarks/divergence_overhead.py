"""What detecting divergence costs a training update (`vanilla_transformer.training.divergence`).

    python benchmarks/divergence_overhead.py                    # tiny preset on the CPU
    python benchmarks/divergence_overhead.py --updates 40 --repeats 7 --device cuda

Two measurements, the same trainer throughout:

1. The loop: `TransformerTrainer.train()` for ``--updates`` updates with the guard and without it (its
   callback removed, ``trainer.divergence = None``), alternating, ``--repeats`` times each; seconds per
   update between the first and the last update's end (set-up excluded), medians, and their ratio.
2. The guard alone: its per-update work (a micro-batch's loss, the gradient norm, folding the update
   into the record on the device) run 2,000 times after the loop, in microseconds an update, and as a
   share of the median update without the guard. On a GPU it launches a handful of tiny kernels and
   reads nothing back (it runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any
   synchronisation), so it overlaps the update rather than adding to it.

Logging is left to the end of each run (``--logging_steps`` = ``--updates``): the one read of the
guard's record per logging step is not an update's cost.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from common import argument_parser
from vanilla_transformer.training import run as train

LETTERS = "a b c d e f g h i j".split()


class UpdateClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.ends = []

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())

    def seconds_per_update(self) -> float:
        return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1)


def tiny_trainer(folder: Path, updates: int, device: str):
    rng = random.Random(0)
    lines = []
    for _ in range(2000):
        words = [rng.choice(LETTERS) for _ in range(rng.randint(3, 12))]
        lines.append(f"{' '.join(words)}\t{' '.join(reversed(words))}\n")
    (folder / "train.tsv").write_text("".join(lines), encoding="utf-8")
    argv = [
        "--train_file",
        str(folder / "train.tsv"),
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "280",
        "--output_dir",
        str(folder / "run"),
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
        "--max_steps",
        str(updates),
        "--logging_steps",
        str(updates),
        "--max_tokens",
        "1000",
        "--cache_dir",
        str(folder / "cache"),
        "--learning_rate",
        "0.001",
        "--warmup_steps",
        "4",
        *(["--use_cpu"] if device == "cpu" else []),
    ]
    return train.build_trainer(*train.parse_arguments(argv)).trainer


def loop_seconds(trainer, clock: UpdateClock, guarded: bool) -> float:
    guard = trainer.divergence_guard
    if guard in trainer.callback_handler.callbacks:
        trainer.remove_callback(guard)
    if guarded:
        trainer.add_callback(guard)
    trainer.divergence = guard if guarded else None
    trainer.train()
    return clock.seconds_per_update()


def guard_microseconds(trainer, repeats: int = 2000) -> float:
    """The guard's per-update work alone, on the trainer's device."""
    guard = trainer.divergence_guard
    device = trainer.args.device
    loss, norm = torch.tensor(3.0, device=device), torch.tensor(1.5, device=device)
    guard.on_train_begin(trainer.args, trainer.state, trainer.control)
    for _ in range(50):
        guard.add_loss(loss), guard.add_grad_norm(norm), guard._fold_update()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call in the guard's update raises
    start = time.perf_counter()
    for _ in range(repeats):
        guard.add_loss(loss), guard.add_grad_norm(norm), guard._fold_update()
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trainer = tiny_trainer(Path(folder), args.updates, args.device)
        trainer.divergence_guard = trainer.divergence
        clock = UpdateClock()
        trainer.add_callback(clock)
        loop_seconds(trainer, clock, guarded=True)  # warm-up
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for guarded in (False, True):
                times[guarded].append(loop_seconds(trainer, clock, guarded))
        without, with_guard = statistics.median(times[False]), statistics.median(times[True])
        alone = guard_microseconds(trainer)
    print(f"device: {trainer.args.device}; {args.updates} updates x {args.repeats} repeats, alternating")
    for name, guarded in (("without the guard", False), ("with the guard   ", True)):
        runs = ", ".join(f"{t * 1e3:.1f}" for t in times[guarded])
        print(f"loop {name}: {statistics.median(times[guarded]) * 1e3:.2f} ms/update (runs: {runs})")
    print(f"ratio with/without: {with_guard / without:.4f}")
    print(f"the guard alone: {alone:.1f} us/update = {alone * 1e-6 / without:.3%} of an update without it")


if __name__ == "__main__":
    main()
