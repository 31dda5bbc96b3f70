"""A folder saved by a user's own script with stock tools (Seq2SeqTrainer.save_model, as transformers'
run_translation.py ends) holds a tokenizer that truncates to what the model accepts, though the tokenizer
was saved with a longer model_max_length. Reference: the model's own refusal of a longer input."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, train_tokenizer

POSITIONS = 24  # fewer than the tokenizer's default model_max_length (1024)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """As run_translation.py ends: trainer.save_model(), the tokenizer as it was given."""
    folder = tmp_path_factory.mktemp("saved")
    tokenizer = train_tokenizer(["a few words to learn from", "noch ein paar Worte"] * 20, vocab_size=300)
    assert tokenizer.model_max_length > POSITIONS
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), max_position_embeddings=POSITIONS, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id)
    model = VanillaTransformerForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(output_dir=str(folder), report_to="none", use_cpu=True)
    trainer = Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)
    trainer.save_model()
    return folder


def test_truncation_keeps_what_the_model_accepts(saved):
    tokenizer, model = AutoTokenizer.from_pretrained(saved), AutoModelForSeq2SeqLM.from_pretrained(saved)
    assert tokenizer.model_max_length == POSITIONS
    text = " ".join(["words"] * 100)
    with pytest.raises(Exception):  # the model refuses more positions than it has
        model(**tokenizer(text, return_tensors="pt"), decoder_input_ids=torch.tensor([[tokenizer.bos_token_id]]))
    inputs = tokenizer(text, truncation=True, return_tensors="pt")
    assert inputs["input_ids"].shape[1] == POSITIONS
    model(**inputs, decoder_input_ids=torch.tensor([[tokenizer.bos_token_id]]))  # accepted
