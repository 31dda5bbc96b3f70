"""Does the data path scale? train.py to its first update on WMT-sized synthetic data, 1 and 2 processes.

    python benchmarks/scale.py                       # 4.5M pairs (WMT14 en-de) and the 30k baseline
    python benchmarks/scale.py --pairs 1000000 --baseline-pairs 30000 --output-dir runs/scale

For each corpus size, generates that many sentence pairs (deterministic: pseudo-words drawn from a
Zipf distribution, log-normal sentence lengths of about 26 words a side, like WMT14 en-de), then runs
``training/train.py`` (``--preset tiny``, a 37k BPE vocabulary, token-count batches) until its first
update (batches of 1,024 tokens, so that one training step's own memory -- logits over 37k tokens --
stays small next to the data path's), four times: one process and two (``accelerate launch --config_file training/accelerate/ddp.yaml
--num_processes 2 ... --use_cpu``, two gloo processes), each first with an empty cache and then again
with the cache the first run left. Prints for each run the wall time to the first update, the peak
resident memory of each training process (VmHWM, polled from /proc) and the CPU time over the wall
time of the preprocessing (how many cores it kept busy), and writes ``results.json``/``results.md``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from common import REPO, argument_parser

LETTERS = "abcdefghijklmnopqrstuvwxyzäöüéè"
FIRST_UPDATE = re.compile(r"\{'loss': ")


# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


def pseudo_words(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct made-up words of 2 to 12 letters."""
    words: dict[str, None] = {}
    while len(words) < count:  # all letters of a round in one draw (a draw per word took seconds)
        lengths = rng.integers(2, 13, size=count)
        text = "".join(np.array(list(LETTERS))[rng.integers(0, len(LETTERS), size=int(lengths.sum()))])
        words.update((text[end - length : end], None) for length, end in zip(lengths, np.cumsum(lengths)))
    return np.array(list(words)[:count])


def write_corpus(folder: Path, pairs: int, seed: int = 0, chunk: int = 100_000) -> tuple[Path, Path]:
    """``pairs`` synthetic pairs as train.src.gz / train.tgt.gz (kept and reused when already written)."""
    source, target, stamp = folder / "train.src.gz", folder / "train.tgt.gz", folder / "complete"
    if stamp.is_file() and stamp.read_text() == f"{pairs} {seed}":
        return source, target
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocabulary = {side: pseudo_words(50_000, rng) for side in ("source", "target")}
    zipf = 1 / np.arange(1, 50_001)
    zipf /= zipf.sum()
    with gzip.open(source, "wt", compresslevel=1) as src, gzip.open(target, "wt", compresslevel=1) as tgt:
        for start in range(0, pairs, chunk):
            size = min(chunk, pairs - start)
            lengths = np.clip(np.rint(rng.lognormal(3.15, 0.5, size=size)), 1, 120).astype(int)
            for handle, side, scale in ((src, "source", 1.0), (tgt, "target", 1.1)):
                counts = np.clip(np.rint(lengths * scale), 1, 150).astype(int)
                words = vocabulary[side][rng.choice(50_000, size=int(counts.sum()), p=zipf)]
                ends = np.cumsum(counts)
                handle.write("".join(" ".join(words[end - n : end]) + "\n" for n, end in zip(counts, ends)))
    stamp.write_text(f"{pairs} {seed}")
    return source, target


# ---------------------------------------------------------------------------------------------
# One run of train.py, watched from outside
# ---------------------------------------------------------------------------------------------


def descendants(pid: int) -> dict[int, int]:
    """pid and every process below it (from /proc), each with its parent's pid."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = {pid: 0}, [pid]
    while todo:
        current = todo.pop()
        for child in children.get(current, []):
            found[child] = current
            todo.append(child)
    return found


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class MemoryWatcher(threading.Thread):
    """Polls the peak resident memory (VmHWM) and anonymous memory (RssAnon) of every process below a pid."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.interval, self.done = pid, interval, threading.Event()
        self.peak: dict[int, int] = {}
        self.anonymous: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.parents: dict[int, int] = {}

    def run(self):
        while not self.done.is_set():
            for pid, parent in descendants(self.pid).items():
                self.parents[pid] = parent
                hwm, anon = status_kib(pid, "VmHWM"), status_kib(pid, "RssAnon")
                if hwm is not None:
                    self.peak[pid] = max(self.peak.get(pid, 0), hwm)
                    self.anonymous[pid] = max(self.anonymous.get(pid, 0), anon or 0)
                    if pid not in self.names:
                        try:
                            self.names[pid] = (
                                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                            )
                        except OSError:
                            self.names[pid] = "?"
            time.sleep(self.interval)


def train_command(processes: int, source: Path, target: Path, output_dir: Path, cache_dir: Path) -> list[str]:
    script = [
        str(REPO / "training/train.py"),
        "--train_source_file",
        str(source),
        "--train_target_file",
        str(target),
        "--output_dir",
        str(output_dir),
        "--cache_dir",
        str(cache_dir),
        "--preset",
        "tiny",
        "--tokenizer_vocab_size",
        "37000",
        "--max_tokens",
        "1024",
        "--max_steps",
        "1",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--eval_strategy",
        "no",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--learning_rate",
        "1e-3",
        "--warmup_steps",
        "1",
    ]
    if processes == 1:
        return [sys.executable, *script]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "training/accelerate/ddp.yaml"),
        "--num_processes",
        str(processes),
        "--main_process_port",
        "29581",
        *script,
    ]


def run_once(processes: int, source: Path, target: Path, work: Path, cache_dir: Path) -> dict:
    """Start train.py, stop watching at its first update; returns the timings and memory."""
    output_dir = work / f"out-{processes}"
    shutil.rmtree(output_dir, ignore_errors=True)
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    cpu_before = os.times()
    process = subprocess.Popen(
        train_command(processes, source, target, output_dir, cache_dir),
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watcher = MemoryWatcher(process.pid)
    watcher.start()
    first_update, log = None, []
    for line in process.stdout:
        log.append(line)
        if first_update is None and FIRST_UPDATE.search(line):
            first_update = time.perf_counter() - started
    process.wait()
    watcher.done.set()
    watcher.join()
    seconds = time.perf_counter() - started
    cpu_after = os.times()
    if process.returncode != 0 or first_update is None:
        raise RuntimeError(f"train.py failed (exit {process.returncode}):\n{''.join(log[-40:])}")
    runs_train = {pid for pid, name in watcher.names.items() if "train.py" in name and "accelerate" not in name}
    # The training processes; processes they fork (the tokenising workers of datasets.map) share their pages.
    trainers = {pid: watcher.peak[pid] for pid in runs_train if watcher.parents.get(pid) not in runs_train}
    cpu = (cpu_after.children_user - cpu_before.children_user) + (
        cpu_after.children_system - cpu_before.children_system
    )
    return {
        "processes": processes,
        "seconds_to_first_update": first_update,
        "seconds_total": seconds,
        "peak_memory_mib_per_process": sorted(round(kib / 1024) for kib in trainers.values()),
        "peak_anonymous_mib_per_process": sorted(round(watcher.anonymous[pid] / 1024) for pid in trainers),
        "cores_busy": cpu / seconds,  # CPU time of every process over the wall time of the whole run
    }


def measure(pairs: int, args) -> list[dict]:
    corpus = Path(args.output_dir) / f"corpus-{pairs}"
    started = time.perf_counter()
    source, target = write_corpus(corpus, pairs, args.seed)
    print(
        f"[{pairs} pairs] corpus ready in {time.perf_counter() - started:.0f} s ({source.stat().st_size >> 20} MiB"
        f" + {target.stat().st_size >> 20} MiB gzip)",
        flush=True,
    )
    results = []
    for processes in args.processes:
        cache_dir = Path(args.output_dir) / f"cache-{pairs}-{processes}"
        shutil.rmtree(cache_dir, ignore_errors=True)
        for run in ("first", "cached"):
            result = {"pairs": pairs, "run": run, **run_once(processes, source, target, corpus, cache_dir)}
            results.append(result)
            print(json.dumps(result), flush=True)
    return results


def markdown(results: list[dict]) -> str:
    rows = [
        "| pairs | processes | run | to first update (s) | peak memory per process (MiB) | of it anonymous (MiB) "
        "| cores busy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        rows.append(
            f"| {r['pairs']:,} | {r['processes']} | {r['run']} | {r['seconds_to_first_update']:.0f} | "
            f"{', '.join(map(str, r['peak_memory_mib_per_process']))} | "
            f"{', '.join(map(str, r['peak_anonymous_mib_per_process']))} | {r['cores_busy']:.2f} |"
        )
    return "\n".join(rows) + "\n"


def main(argv=None) -> list[dict]:
    parser = argument_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=4_500_000, help="the large corpus (WMT14 en-de: 4.5M)")
    parser.add_argument("--baseline-pairs", type=int, default=30_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--output-dir", default="runs/scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("pairs", "baseline_pairs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    results = [r for pairs in (args.baseline_pairs, args.pairs) for r in measure(pairs, args)]
    output = Path(args.output_dir)
    (output / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (output / "results.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
