"""The README's "Your own Trainer script" runs as printed: extracted from README.md, run on a tiny
run_translation-style corpus, it trains, evaluates with BLEU and saves a model the Auto classes load; the
fine-tuning script the README links to (docs/training.md), extracted the same way, then fine-tunes that model."""

import json
import random
import re
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import vanilla_transformer  # noqa: F401  (registers the Auto classes in this process)
from helpers import REPO


def section(path, heading: str) -> str:
    return path.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def readme_scripts() -> list[str]:
    """The Python blocks of the README's "Your own Trainer script" section, then docs/training.md's
    "Fine-tuning a checkpoint", in order."""
    blocks = [
        section(REPO / "README.md", "Your own Trainer script"),
        section(REPO / "docs" / "training.md", "Fine-tuning a checkpoint"),
    ]
    return [script for block in blocks for script in re.findall(r"```python\n(.*?)```", block, re.S)]


def write_jsonl(path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    words = "a dog runs man woman sits on the bench two children play in park".split()
    lines = []
    for _ in range(count):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 8)))
        lines.append(json.dumps({"translation": {"en": sentence, "de": sentence.upper()}}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_script(folder, name: str, source: str, *argv: str) -> subprocess.CompletedProcess:
    script = folder / name
    script.write_text(source, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, str(script), *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed


def test_the_readme_has_the_script_and_the_fine_tuning_script():
    scripts = readme_scripts()
    assert "(docs/training.md#fine-tuning-a-checkpoint)" in section(REPO / "README.md", "Your own Trainer script")
    assert len(scripts) == 2
    assert "train_tokenizer(" in scripts[0] and "AutoTokenizer.from_pretrained(checkpoint)" in scripts[1]


def test_the_readme_script_trains_evaluates_and_saves_and_its_fine_tuning_script_continues_it(tmp_path):
    own_script, fine_tuning = readme_scripts()
    write_jsonl(tmp_path / "train.jsonl", 300, seed=0)
    write_jsonl(tmp_path / "valid.jsonl", 8, seed=1)
    completed = run_script(tmp_path, "my_script.py", own_script, "train.jsonl", "valid.jsonl", "my-model", "12")
    assert "'eval_bleu'" in completed.stdout and "'eval_gen_len'" in completed.stdout
    state = json.loads((tmp_path / "my-model" / "checkpoint-12" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "my-model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "my-model")
    assert model.config.d_model == 256 and len(tokenizer) == model.config.vocab_size
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty_formula == "gnmt"

    # Fine-tuning: the same vocabulary and architecture, weights moved by 4 updates at the fine-tuning peak.
    completed = run_script(
        tmp_path, "fine_tune.py", fine_tuning, "my-model", "train.jsonl", "valid.jsonl", "my-model-tuned", "4"
    )
    assert "'eval_bleu'" in completed.stdout
    state = json.loads((tmp_path / "my-model-tuned" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    tuned = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "my-model-tuned")
    assert tuned.config.to_diff_dict() == model.config.to_diff_dict()
    assert AutoTokenizer.from_pretrained(tmp_path / "my-model-tuned").get_vocab() == tokenizer.get_vocab()
    before = load_file(tmp_path / "my-model" / "model.safetensors")
    after = load_file(tmp_path / "my-model-tuned" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[name], after[name]) for name in before)
