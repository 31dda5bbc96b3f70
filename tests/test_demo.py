"""The README's main command runs end to end (scaled down so that it takes seconds)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
import demo  # noqa: E402


def test_demo_trains_saves_reloads_and_translates(tmp_path, capsys):
    output_dir = tmp_path / "demo"
    demo.main(["--output-dir", str(output_dir), "--train-size", "200", "--test-size", "8",
               "--max-steps", "20", "--batch-size", "16", "--warmup-steps", "5"])
    printed = capsys.readouterr().out
    saved = {p.name for p in output_dir.iterdir()}
    # the Hub format: weights, config with auto_map, generation settings, tokenizer, remote code
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "modeling_vanilla_transformer.py"} <= saved
    assert "reloaded with the Auto classes: VanillaTransformerForConditionalGeneration" in printed
    assert "held-out exact match:" in printed and "character BLEU" in printed
    assert printed.count(" -> ") == 8  # one beam-search translation per held-out number
