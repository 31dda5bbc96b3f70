"""The run's steps from a script, with plain parameters (no CLI dataclasses): the same tokenizer, model
config and token ids as `vanilla-transformer train` builds from the equivalent flags (the reference)."""

from pathlib import Path

import pytest
from transformers import DataCollatorForSeq2Seq, set_seed

from test_train import reverse_pairs, tiny_args, write_pairs
from vanilla_transformer.training import TransformerTrainer, TransformerTrainingArguments, parallel_text_dataset
from vanilla_transformer.training import run as train
from vanilla_transformer.training.data import tokenize_pairs
from vanilla_transformer.training.run import prepare_model, prepare_tokenizer, set_decoding


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reverse")
    write_pairs(folder, "train", reverse_pairs(150, seed=1))
    return folder


def test_the_steps_with_plain_parameters_build_what_the_flags_build(data_dir, tmp_path):
    flags = train.build_trainer(
        *train.parse_arguments(
            tiny_args(
                data_dir,
                tmp_path / "flags",
                "--config_overrides",
                "dropout=0.0",
                "--max_steps",
                "2",
                "--warmup_steps",
                "1",
                "--length_penalty",
                "1.2",
                "--cache_dir",
                str(tmp_path / "cache-flags"),
            )
        )
    )

    set_seed(42)
    text = parallel_text_dataset(data_dir / "train.src", data_dir / "train.tgt", cache_dir=str(tmp_path / "cache"))
    tokenizer = prepare_tokenizer(text, vocab_size=280, seed=42, cache_dir=str(tmp_path / "cache"))
    model = prepare_model(tokenizer, preset="tiny", config_overrides={"dropout": 0.0})
    ids = tokenize_pairs(text, tokenizer, model.config, max_tokens=4096)
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "script"),
        max_steps=2,
        warmup_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    trainer = TransformerTrainer(
        model=model,
        args=args,
        train_dataset=ids,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    set_decoding(trainer.model, length_penalty=1.2)

    assert tokenizer.backend_tokenizer.to_str() == flags.tokenizer.backend_tokenizer.to_str()
    reference = flags.trainer.model
    assert model.config.to_dict() == reference.config.to_dict()
    assert model.generation_config.length_penalty == reference.generation_config.length_penalty == 1.2
    assert (
        ids["input_ids"] == flags.datasets["train"]["input_ids"] and ids["labels"] == flags.datasets["train"]["labels"]
    )
    assert trainer.train().global_step == 2
