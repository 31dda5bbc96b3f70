"""What the benchmark scripts share: their common flags, the Multi30k files and model shape, alternating timing,
the machine a number was measured on, and a run in a child process of its own.

The scripts run as ``python benchmarks/NAME.py``, which puts this folder first on Python's path, so each one
imports this module as ``common`` (the tests find it through pyproject.toml's pytest ``pythonpath``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO.parent / "shared" / "data" / "multi30k"  # a clone beside the shared data folder
PAIRS = {"en-de": ("en", "de"), "de-en": ("de", "en"), "en-fr": ("en", "fr")}
# The Multi30k benchmark's model in MarianConfig's words: d_model 256, 3+3 layers, 4 heads, FFN 1024, ReLU,
# embeddings scaled by sqrt(d_model) (the paper's architecture at a small size).
MULTI30K_SHAPE = dict(
    d_model=256,
    encoder_layers=3,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=1024,
    decoder_ffn_dim=1024,
    activation_function="relu",
    scale_embedding=True,
)


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of the script's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=str(DATA_DIR))


def add_timing_flags(parser: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--cpu-time``, read by `clock_of`."""
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process's CPU time instead of the wall clock: steadier on a machine "
        "others share, meaningful with --threads 1",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")


def clock_of(args) -> Callable[[], float]:
    """Sets torch's threads as ``--threads`` says; the clock ``--cpu-time`` chooses."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    return time.process_time if args.cpu_time else time.perf_counter


def multi30k_folder(path: str | Path, nothing: str = "nothing to benchmark") -> Path | None:
    """The Multi30k folder, or None after saying it is missing: a user's clone has no ../shared, and a
    benchmark without its data is not an error."""
    if not Path(path).is_dir():
        print(f"Multi30k not found at {path} (give --data-dir): {nothing}.")
        return None
    return Path(path)


# ---------------------------------------------------------------------------------------------
# Data and models
# ---------------------------------------------------------------------------------------------


def split_files(data_dir: Path, split: str, source: str, target: str) -> tuple[Path, Path]:
    return Path(data_dir) / f"{split}.{source}.gz", Path(data_dir) / f"{split}.{target}.gz"


def read_split(data_dir: Path, split: str, pair: str = "en-de", limit: int | None = None) -> list[tuple[str, str]]:
    """The sentence pairs of one Multi30k split (``train``, ``val``, ``test_2016_flickr``), the first ``limit``."""
    from vanilla_transformer.training import read_parallel

    return read_parallel(*split_files(data_dir, split, *PAIRS[pair]))[:limit]


def joint_bpe(pairs, vocab_size: int = 10000):
    """The package's joint byte-level BPE learned from both sides of ``pairs``."""
    import vanilla_transformer

    return vanilla_transformer.train_tokenizer((text for pair in pairs for text in pair), vocab_size=vocab_size)


def marian_config(tokenizer, **settings):
    """A MarianConfig for ``tokenizer``'s vocabulary and special tokens (``<pad>`` starts the decoder, as in
    MarianMT), with ``settings`` (the shape, dropout, ...)."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=len(tokenizer),
        decoder_vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **settings,
    )


def ctranslate2_translator(
    model, folder: Path, tokenizer, compute_type: str, device: str = "cpu", quantization: str | None = None
):
    """``model`` exported by `vanilla_transformer.convert.to_ctranslate2` into ``folder`` (weights stored as
    ``quantization``, None: as they are) and loaded as a `ctranslate2.Translator` computing in
    ``compute_type``; on the CPU one translation at a time on torch's threads."""
    import ctranslate2
    import torch

    from vanilla_transformer.convert import to_ctranslate2

    folder = to_ctranslate2(model, folder, quantization=quantization, tokenizer=tokenizer, force=True)
    threads = {"inter_threads": 1, "intra_threads": torch.get_num_threads()} if device == "cpu" else {}
    return ctranslate2.Translator(str(folder), device=device, compute_type=compute_type, **threads)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def alternate(
    tasks: dict[str, Callable], repeats: int, warmup: int = 1, clock: Callable[[], float] = time.perf_counter
) -> tuple[dict[str, list[float]], dict]:
    """``warmup`` untimed passes of every task, then ``repeats`` timed passes in turn (ABAB...), so that a
    slow drift of the machine hits every task alike: the seconds of each pass, and each task's last output."""
    outputs = {}
    for _ in range(warmup):
        outputs = {name: task() for name, task in tasks.items()}
    seconds = {name: [] for name in tasks}
    for _ in range(repeats):
        for name, task in tasks.items():
            started = clock()
            outputs[name] = task()
            seconds[name].append(clock() - started)
    return seconds, outputs


def speed_ratio(slower: list[float], faster: list[float]) -> tuple[float, float, float]:
    """How many times faster ``faster`` ran than ``slower``: the ratio of the medians, and the lowest and highest
    ratio of the passes timed side by side."""
    ratios = sorted(s / f for s, f in zip(slower, faster))
    return statistics.median(slower) / statistics.median(faster), ratios[0], ratios[-1]


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------


def machine() -> str:
    """The CPU, its cores, torch, transformers and Python, in one line (results files compare it as a string)."""
    import torch
    import transformers

    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}"
    )


def peak_memory_mib() -> float:
    """This process's peak resident memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_gflops() -> float:
    """How fast this machine multiplies float32 matrices now: the median of 15 1024 x 1024 products."""
    from vanilla_transformer.training.flops import matmul_flops_per_second

    return statistics.median(matmul_flops_per_second()) / 1e9


def cpu_seconds() -> dict[str, float]:
    """CPU time spent so far by this process (all its threads) and its ended children ("own"), and by the CPUs
    it may run on (psutil's per-CPU times): "busy" (user, nice, system, irq, softirq; guest time is already
    inside user and nice), "steal" (given by the hypervisor to other guests) and "total" (those and idle and
    iowait: the CPUs' capacity over the same span). `machine_load` compares two of these. Children still
    running (e.g. data-loader workers, 0 in the recipe) count as other processes."""
    import psutil

    own = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = {"own": sum(usage.ru_utime + usage.ru_stime for usage in own)}
    per_cpu = psutil.cpu_times(percpu=True)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    times = [per_cpu[cpu]._asdict() for cpu in cpus if cpu < len(per_cpu)]
    busy = ("user", "nice", "system", "irq", "softirq")
    seconds["busy"] = sum(cpu.get(name, 0.0) for cpu in times for name in busy)
    seconds["steal"] = sum(cpu.get("steal", 0.0) for cpu in times)
    seconds["total"] = (
        seconds["busy"] + seconds["steal"] + sum(cpu.get("idle", 0.0) + cpu.get("iowait", 0.0) for cpu in times)
    )
    return seconds


def machine_load(gflops_before: float, before: dict, after: dict, gflops_after: float) -> dict:
    """How much of the machine a run had while it trained. A time budget buys as many updates as the machine
    gives: a slower machine (matmul GFLOP/s before and after training) or other work on its CPUs
    (others_cpu_share: the share of the CPUs' time that other processes took; steal_share: the share the
    hypervisor gave to other guests) lowers a run's score without any change to its recipe."""
    load = {"matmul_gflops_before": gflops_before, "matmul_gflops_after": gflops_after}
    capacity = after.get("total", 0.0) - before.get("total", 0.0)
    if capacity > 0:
        others = (after["busy"] - before["busy"]) - (after["own"] - before["own"])
        load.update(
            others_cpu_share=max(others, 0.0) / capacity, steal_share=(after["steal"] - before["steal"]) / capacity
        )
    return load


# ---------------------------------------------------------------------------------------------
# A run in a child process
# ---------------------------------------------------------------------------------------------


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """A run must not outlive the benchmark: one left training after the benchmark was stopped would share
    the CPU, unseen, with the next measurement (it happened: a stopped lever run kept training and halved
    the next run's updates). On Linux the kernel sends this process SIGTERM when its parent dies (prctl's
    PR_SET_PDEATHSIG; neither the standard library nor psutil offers it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent was gone before that
        os._exit(1)


def _child(queue, parent: int, function, *arguments):
    die_with_parent(parent)
    try:
        queue.put(("ok", function(*arguments)))
    except BaseException as error:  # report to the parent instead of dying silently
        import traceback

        queue.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def run_in_child(function, *arguments):
    """``function(*arguments)`` in a fresh process (its own peak memory, no state shared with the parent),
    which dies with this one. A child that dies without a result (killed, out of memory) is an error
    naming its exit code, not a parent waiting forever."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(queue, os.getpid(), function, *arguments))
    process.start()
    while True:
        try:
            status, payload = queue.get(timeout=2)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(
                    f"{function.__name__}{arguments[:1]}: the child process died with exit code "
                    f"{process.exitcode} before it reported a result"
                ) from None
    process.join()
    if status != "ok":
        raise RuntimeError(f"{arguments[0]} failed in its child process:\n{payload}")
    return payload
