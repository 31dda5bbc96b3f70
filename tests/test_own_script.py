"""The README's "Your own Trainer script" runs as printed: extracted from README.md, run on a tiny
run_translation-style corpus, it trains, evaluates with BLEU and saves a model the Auto classes load."""

import json
import random
import re
import subprocess
import sys

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import vanilla_transformer  # noqa: F401  (registers the Auto classes in this process)

from helpers import REPO


def readme_script() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Your own Trainer script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def write_jsonl(path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    words = "a dog runs man woman sits on the bench two children play in park".split()
    lines = []
    for _ in range(count):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 8)))
        lines.append(json.dumps({"translation": {"en": sentence, "de": sentence.upper()}}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_readme_script_trains_evaluates_and_saves(tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(readme_script(), encoding="utf-8")
    write_jsonl(tmp_path / "train.jsonl", 300, seed=0)
    write_jsonl(tmp_path / "valid.jsonl", 8, seed=1)
    completed = subprocess.run(
        [sys.executable, str(script), "train.jsonl", "valid.jsonl", "my-model", "12"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "'eval_bleu'" in completed.stdout and "'eval_gen_len'" in completed.stdout
    state = json.loads((tmp_path / "my-model" / "checkpoint-12" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "my-model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "my-model")
    assert model.config.d_model == 256 and len(tokenizer) == model.config.vocab_size
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty_formula == "gnmt"
