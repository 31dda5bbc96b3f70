"""Model cards: the README.md of a checkpoint, with the metadata the Hub reads and the recipe people read.

`write_model_card` is called by the training scripts and the benchmark after they save a model. The
YAML front matter comes from huggingface_hub's `ModelCardData` (language, license, library,
``pipeline_tag: translation``, tags, datasets, base model, and a ``model-index`` with each measured
score and its sacreBLEU signature), so it is exactly what the Hub parses. The body is `TEMPLATE`,
filled with `str.format`: plain text kept in this module because a template file outside the package
would not be installed with it (and Jinja is not a dependency).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCardData
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import MAX_EXTRA_OUTPUT_TOKENS, MAX_NEW_TOKENS_BEYOND_INPUT, penalty_formula_of
from .modeling_vanilla_transformer import MODEL_TAGS
from .pipeline_vanilla_transformer import REMOTE_CODE_TASK, TASK

TAGS = [*MODEL_TAGS, "transformer", "attention-is-all-you-need", "seq2seq"]
REQUIRED_METRIC_KEYS = {"name", "type", "value", "dataset"}
OPTIONAL_METRIC_KEYS = {"dataset_name", "dataset_config", "split", "signature"}
# generate()'s new tokens where no length is set at all (transformers' default max_length, 20 beyond the input)
DEFAULT_NEW_TOKENS = 20

TEMPLATE = """\
# {title}

A Transformer (Vaswani et al., 2017, "Attention Is All You Need") that translates {source} to {target},
written as a native 🤗 transformers model by the `vanilla-transformer` package.{fine_tuned}

## Results

{results}

## Model

| | |
| --- | --- |
{architecture}

## Training

{training}

## How to use

With the `vanilla-transformer` package installed, its own code serves the model:

```python
import vanilla_transformer  # registers the model, the tokenizer and the "{task}" pipeline
from transformers import pipeline

translate = pipeline("{task}", model="{repo_id}")
print(translate("{example}"))  # [{{'translation_text': '...'}}]
```

Without the package, the copy of its code in this repository serves it (`trust_remote_code=True`):

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

translate = pipeline("{remote_task}", model="{repo_id}", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
generated = model.generate(**tokenizer(["{example}"], return_tensors="pt"))
print(tokenizer.batch_decode(generated, skip_special_tokens=True))
```

## Limitations

- One direction only: {source} to {target}. The tokenizer has no language codes, so `src_lang` and
  `tgt_lang` are rejected.
- Sentence-level: each input is translated on its own, without the surrounding document. Inputs
  longer than {max_positions} tokens are rejected, not truncated.
- The model knows only its training data ({datasets}); expect worse translations in other domains,
  and fluent but wrong ones for rare names, numbers and terms.
- Scores are comparable only with scores computed the same way: same test set, same sacreBLEU
  signature.

{notes}## Citation

```bibtex
@inproceedings{{vaswani2017attention,
  title     = {{Attention Is All You Need}},
  author    = {{Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and
               Jones, Llion and Gomez, Aidan N. and Kaiser, {{\\L}}ukasz and Polosukhin, Illia}},
  booktitle = {{Advances in Neural Information Processing Systems}},
  volume    = {{30}},
  year      = {{2017}}
}}
```
"""


def write_model_card(
    output_dir: str | os.PathLike,
    *,
    languages: tuple[str, str],
    model: PreTrainedModel | None = None,
    config: PretrainedConfig | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    datasets: Sequence[str] = (),
    training_data: str | None = None,
    metrics: Sequence[Mapping[str, Any]] = (),
    training_hyperparameters: Mapping[str, Any] | None = None,
    base_model: str | None = None,
    local_base_model: str | None = None,
    license: str = "apache-2.0",
    tags: Sequence[str] = (),
    extra_notes: str | None = None,
) -> Path:
    """Write ``output_dir/README.md``: Hub metadata, results, architecture, training, usage, limitations.

    Args:
        output_dir: the checkpoint folder (created if missing).
        languages: ``(source, target)`` language codes, e.g. ``("en", "de")``.
        model, config: what the card describes; give one. ``model`` adds the parameter count and its
            generation settings. With neither, ``output_dir/config.json`` is read.
        repo_id: the Hub id the usage examples load (default: the folder's name under ``<user>/``).
        model_name: the card's title and the model-index name (default: the repo's name).
        datasets: Hub ids (or names) of the training data.
        training_data: what the card's text calls the training data where it is no Hub dataset (local files,
            e.g. "train.en.gz and train.de.gz"); default: ``datasets``.
        metrics: one mapping per score: ``name`` (shown, e.g. "BLEU"), ``type`` (metric id, e.g.
            "bleu", "chrf"), ``value``, ``dataset`` (id or name of the test set); optionally
            ``dataset_name``, ``dataset_config`` (e.g. "de-en"), ``split`` and ``signature`` (the
            sacreBLEU signature, kept in the model-index as ``args.signature``).
        training_hyperparameters: name -> value, shown as a table (e.g. the Trainer's arguments).
        base_model: Hub id of the model this one was fine-tuned from.
        local_base_model: the name of a local checkpoint folder it was fine-tuned from instead (said in the
            text; the Hub's ``base_model`` metadata takes Hub ids only).
        license: an SPDX-style id as the Hub knows them.
        tags: extra Hub tags, after the package's own.
        extra_notes: Markdown appended to the limitations, e.g. how this run differs from the paper.

    Returns:
        The path of the README.md written.
    """
    source, target = _checked_languages(languages)
    output_dir = Path(output_dir)
    config, generation_config, num_parameters = _described_model(output_dir, model, config)
    repo_id = repo_id or f"<user>/{output_dir.resolve().name}"
    model_name = model_name or repo_id.rsplit("/", 1)[-1]
    results = [_eval_result(metric, index, source, target) for index, metric in enumerate(metrics)]
    card_data = ModelCardData(
        language=[source, target] if source != target else [source],
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=list(dict.fromkeys([*TAGS, *tags])),
        datasets=list(datasets) or None,
        base_model=base_model,
        metrics=list(dict.fromkeys(result.metric_type for result in results)) or None,
        model_name=model_name,
        eval_results=results or None,
    )
    data_words = training_data or ", ".join(datasets) or "not recorded"
    body = TEMPLATE.format(
        title=model_name,
        source=source,
        target=target,
        fine_tuned=_fine_tuned_sentence(base_model, local_base_model),
        results=_results_table(results),
        architecture=_architecture_rows(config, num_parameters),
        training=_training_section(data_words, training_hyperparameters, generation_config, config),
        datasets=data_words,
        task=TASK,
        remote_task=REMOTE_CODE_TASK,
        repo_id=repo_id,
        example=_EXAMPLE_SENTENCES.get(source, "..."),
        max_positions=config.max_position_embeddings,
        notes=f"## Notes\n\n{extra_notes.strip()}\n\n" if extra_notes else "",
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "README.md"
    path.write_text(f"---\n{card_data.to_yaml()}\n---\n\n{body}", encoding="utf-8")
    return path


_EXAMPLE_SENTENCES = {
    "en": "A man is riding a bicycle down the street.",
    "de": "Ein Mann fährt mit dem Fahrrad die Straße entlang.",
    "fr": "Un homme descend la rue à vélo.",
}


def _checked_languages(languages) -> tuple[str, str]:
    if (
        not isinstance(languages, (tuple, list))
        or len(languages) != 2
        or not all(isinstance(code, str) and code.strip() for code in languages)
    ):
        raise ValueError(f"languages must be (source, target) language codes such as ('en', 'de'), got {languages!r}.")
    return languages[0], languages[1]


def _described_model(output_dir: Path, model, config) -> tuple[PretrainedConfig, GenerationConfig | None, int | None]:
    """The config, generation settings and parameter count the card reports."""
    if model is not None and config is not None:
        raise ValueError("Pass model or config, not both: the card describes model.config when a model is given.")
    if model is not None:
        return model.config, model.generation_config, model.num_parameters()
    if config is None:
        if not (output_dir / "config.json").is_file():
            raise ValueError(
                f"No model or config given and no config.json in {output_dir}: pass model=... or config=..., "
                "or save the model there first."
            )
        config = VanillaTransformerConfig.from_pretrained(output_dir)
    generation_file = output_dir / "generation_config.json"
    generation_config = GenerationConfig.from_pretrained(output_dir) if generation_file.is_file() else None
    return config, generation_config, None


def _eval_result(metric: Mapping[str, Any], index: int, source: str, target: str) -> EvalResult:
    keys = set(metric)
    if missing := REQUIRED_METRIC_KEYS - keys:
        raise ValueError(f"metrics[{index}] lacks {sorted(missing)}; each score needs {sorted(REQUIRED_METRIC_KEYS)}.")
    if unknown := keys - REQUIRED_METRIC_KEYS - OPTIONAL_METRIC_KEYS:
        raise ValueError(
            f"metrics[{index}] has unknown keys {sorted(unknown)}; allowed: "
            f"{sorted(REQUIRED_METRIC_KEYS | OPTIONAL_METRIC_KEYS)}."
        )
    value = metric["value"]
    if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"metrics[{index}]['value'] must be a finite number, got {value!r}.")
    return EvalResult(
        task_type="translation",
        task_name=f"Translation {source}-{target}",
        dataset_type=metric["dataset"],
        dataset_name=metric.get("dataset_name", metric["dataset"]),
        dataset_config=metric.get("dataset_config"),
        dataset_split=metric.get("split"),
        metric_type=metric["type"],
        metric_name=metric["name"],
        metric_value=float(value),
        metric_args={"signature": metric["signature"]} if metric.get("signature") else None,
    )


def _results_table(results: list[EvalResult]) -> str:
    if not results:
        return "No evaluation results were recorded for this checkpoint."
    rows = ["| data | split | metric | score | sacreBLEU signature |", "| --- | --- | --- | --- | --- |"]
    for result in results:
        data = result.dataset_name + (f" ({result.dataset_config})" if result.dataset_config else "")
        # A | inside a table cell ends the cell, even in a code span, unless escaped (GitHub Markdown).
        signature = "`" + result.metric_args["signature"].replace("|", "\\|") + "`" if result.metric_args else "-"
        split = result.dataset_split or "-"
        rows.append(f"| {data} | {split} | {result.metric_name} | {result.metric_value:.2f} | {signature} |")
    return "\n".join(rows)


def _both(encoder, decoder) -> str:
    """One value where the encoder's and the decoder's agree, else ``encoder / decoder`` (a converted model's)."""
    return f"{encoder}" if encoder == decoder else f"{encoder} (encoder) / {decoder} (decoder)"


def _architecture_rows(config: PretrainedConfig, num_parameters: int | None) -> str:
    heads = (config.encoder_attention_heads, config.decoder_attention_heads)
    d_k = [config.head_dim or config.d_model // count for count in heads]
    rows = {
        "layers (encoder + decoder)": f"{config.encoder_layers} + {config.decoder_layers}",
        "d_model / d_ff": f"{config.d_model} / {_both(config.encoder_ffn_dim, config.decoder_ffn_dim)}",
        "attention heads (d_k)": _both(*(f"{count} ({size})" for count, size in zip(heads, d_k, strict=True))),
        "residual blocks": "pre-norm" if config.normalize_before else "post-norm, as in the paper",
        "positions": config.position_embedding_type,
        "vocabulary": _vocabulary(config),
        "dropout": f"{config.dropout}",
    }
    if num_parameters is not None:
        rows["parameters"] = f"{num_parameters / 1e6:.1f}M"
    return "\n".join(f"| {name} | {value} |" for name, value in rows.items())


def _vocabulary(config: PretrainedConfig) -> str:
    """The sizes and which matrices are one (§3.4: both embeddings and the pre-softmax projection)."""
    if config.share_encoder_decoder_embeddings:
        shared = "one matrix for both embeddings" + (" and the output projection" if config.tie_word_embeddings else "")
        return f"{config.vocab_size}, {shared}"
    tied = ", the output projection is the target embedding" if config.tie_word_embeddings else ""
    return f"{config.vocab_size} (source) / {config.decoder_vocab_size} (target){tied}"


def _fine_tuned_sentence(base_model: str | None, local_base_model: str | None) -> str:
    if base_model:
        return f" Fine-tuned from [{base_model}](https://huggingface.co/{base_model})."
    return f" Fine-tuned from a local checkpoint, `{local_base_model}`." if local_base_model else ""


def _training_section(data_words: str, hyperparameters: Mapping[str, Any] | None, generation_config, config) -> str:
    parts = [f"Training data: {data_words}."]
    if hyperparameters:
        rows = ["| hyperparameter | value |", "| --- | --- |"]
        parts.append("\n".join(rows + [f"| {name} | {value} |" for name, value in hyperparameters.items()]))
    else:
        parts.append("Training hyperparameters were not recorded.")
    if generation_config is not None:
        parts.append(_decoding_sentence(generation_config, config.max_position_embeddings))
    return "\n\n".join(parts)


def _decoding_sentence(generation_config: GenerationConfig, positions: int) -> str:
    # as generate() reads the model's own config (`_extra_tokens`): max_new_tokens, else §6.1's rule, which
    # ignores max_length (a Trainer's 20, or max_position_embeddings as saved for other readers) and stops at the
    # positions the model has (the start token takes one), else max_length
    extra = getattr(generation_config, MAX_NEW_TOKENS_BEYOND_INPUT, MAX_EXTRA_OUTPUT_TOKENS)
    cap = f", {positions - 1} at most"
    length = (
        f"at most {generation_config.max_new_tokens} new tokens"
        if generation_config.max_new_tokens
        else f"at most input length + {extra} tokens (§6.1{cap})"
        if extra is not None
        else f"at most {generation_config.max_length} tokens"
        if generation_config.max_length is not None
        else f"at most {min(DEFAULT_NEW_TOKENS, positions - 1)} new tokens (transformers' default)"
    )
    # what generate() does with a setting left unset (None in transformers 5's GenerationConfig)
    beams = generation_config.num_beams or 1
    if beams == 1:  # greedy search: no length penalty applies
        return f"Decoding (`generation_config.json`): greedy (beam size 1), {length}."
    name = penalty_formula_of(generation_config)
    formula = {"gnmt": "GNMT's ((5 + |Y|) / 6)^alpha, as the paper", "length": "|Y|^alpha"}.get(
        name, f"formula {name!r}"
    )
    alpha = 1.0 if generation_config.length_penalty is None else generation_config.length_penalty
    return (
        f"Decoding (`generation_config.json`): beam size {beams}, length penalty alpha {alpha:g} ({formula}), {length}."
    )


__all__ = ["write_model_card"]
