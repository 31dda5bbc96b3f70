"""train.py's evaluation decodes the validation sentences longest first (less padding, rows of a batch ending
together), and reports exactly what it reports in the input order; predict() keeps the input order."""

from pathlib import Path

import pytest
from torch.utils.data import SequentialSampler

from vanilla_transformer.training import run as train


def write_pairs(folder: Path, name: str, pairs) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (folder / f"{name}.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def test_evaluation_sorts_by_source_length_and_reports_the_same(tmp_path):
    words = "a b c d e f g h".split()
    pairs = [(" ".join(words[: 1 + (i * 5) % 8]), " ".join(reversed(words[: 1 + (i * 5) % 8]))) for i in range(40)]
    write_pairs(tmp_path / "data", "train", pairs)
    write_pairs(tmp_path / "data", "valid", pairs[:11])
    data = tmp_path / "data"
    run = train.build_trainer(*train.parse_arguments([
        "--train_source_file", str(data / "train.src"), "--train_target_file", str(data / "train.tgt"),
        "--validation_source_file", str(data / "valid.src"), "--validation_target_file", str(data / "valid.tgt"),
        "--preset", "tiny", "--tokenizer_vocab_size", "270", "--output_dir", str(tmp_path / "out"), "--report_to",
        "none", "--use_cpu", "--disable_tqdm", "true", "--save_strategy", "no", "--eval_strategy", "no",
        "--per_device_eval_batch_size", "4", "--generation_num_beams", "2", "--generation_max_length", "12",
    ]))
    trainer, validation = run.trainer, run.datasets["validation"]
    orders = []
    original = trainer._get_eval_sampler

    def recording(dataset):
        sampler = original(dataset)
        orders.append(list(sampler))
        return sampler

    trainer._get_eval_sampler = recording
    sorted_metrics = trainer.evaluate()
    lengths = [len(example["input_ids"]) for example in validation]
    assert sorted(orders[0]) == list(range(len(validation)))
    assert [lengths[i] for i in orders[0]] == sorted(lengths, reverse=True)
    trainer.predict(validation)
    assert orders[1] == list(range(len(validation)))  # predict(): the input order
    trainer._get_eval_sampler = lambda dataset: SequentialSampler(dataset)
    plain_metrics = trainer.evaluate()
    for name in ("eval_loss", "eval_bleu", "eval_chrf", "eval_gen_len"):
        if name in plain_metrics:
            assert sorted_metrics[name] == pytest.approx(plain_metrics[name], rel=1e-5), name
    assert "eval_bleu" in plain_metrics
