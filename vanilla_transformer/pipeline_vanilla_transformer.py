"""A translation pipeline for sequence-to-sequence models: text in, ``[{"translation_text": ...}]`` out.

transformers 5 removed the built-in ``"translation"`` and ``"text2text-generation"`` tasks (asking for
them raises ``KeyError``); this pipeline gives the old call and output format back::

    translate = pipeline("vanilla-translation", model="user/vanilla-transformer-en-de")
    translate("A man walks on the street.")        # [{"translation_text": "..."}]
    translate(["One.", "Two."], batch_size=2)      # [{"translation_text": ...}, {"translation_text": ...}]

Decoding follows the model's ``generation_config``; for this package's checkpoints that is the
paper's (§6.1): beam size 4, length penalty 0.6, at most input length + 50 tokens. Any generation
parameter (``num_beams=1``, ``max_new_tokens=...``) can be given at construction or per call.

Two task names, because of how transformers 5.23 resolves them:

- ``"vanilla-translation"``: registered when the package is imported, so
  ``pipeline("vanilla-translation", model=folder_or_repo)`` runs the installed code.
- ``"translation"``: declared in every checkpoint's ``config.json`` (``custom_pipelines``, next to
  ``auto_map``) with this file copied next to the weights, so that
  ``pipeline("translation", model=folder_or_repo, trust_remote_code=True)`` works where the package
  is not installed. transformers looks a checkpoint's own tasks up before it rejects removed task
  names, and it demands ``trust_remote_code=True`` for any task a checkpoint declares, even one
  registered locally: one name for both uses would force installed users to run the checkpoint's
  code. Hence the registered name differs from the declared one.

Like the other files copied next to the weights, this one imports only ``transformers`` and ``torch``.
"""

from __future__ import annotations

import types

import torch
from torch.utils.data import IterableDataset
from transformers import GenerationConfig, Pipeline
from transformers.utils import logging

logger = logging.get_logger(__name__)

TASK = "vanilla-translation"  # registered by `import vanilla_transformer`
REMOTE_CODE_TASK = "translation"  # declared by checkpoints, for trust_remote_code=True
# The `custom_pipelines` entry of config.json, in the form `Pipeline.save_pretrained` writes.
CUSTOM_PIPELINES = {
    REMOTE_CODE_TASK: {
        "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
    }
}

# The special ids a tokenizer and a model config must agree on (same attribute name on both).
SPECIAL_TOKEN_IDS = ("pad_token_id", "eos_token_id", "bos_token_id")


# What `check_tokenizer_matches_model` tells a Python caller to do; a command line names its flags instead.
LOAD_THE_MODELS_TOKENIZER = (
    "Load the tokenizer saved with the model (AutoTokenizer.from_pretrained on the same folder or repo). If you "
    "trained the model yourself, build its config from the tokenizer: vocab_size=len(tokenizer) and pad/eos/bos ids "
    "(and decoder_start_token_id) from tokenizer.pad_token_id, eos_token_id and bos_token_id."
)


def check_tokenizer_matches_model(tokenizer, config, warn: bool = True, fix: str = LOAD_THE_MODELS_TOKENIZER) -> None:
    """Raise ``ValueError`` when ``tokenizer`` cannot be the one ``config``'s model was trained with.

    Checked: the ids of ``<pad>``, ``</s>`` and ``<s>`` (where both sides define one), and that every
    token id of the tokenizer exists in the model's (source) vocabulary. Either mismatch means the
    model would read the wrong tokens (or index past its embedding matrix) without any error.

    A tokenizer with fewer tokens than the model's target vocabulary is warned about, not refused (a
    vocabulary padded to a multiple of 8 is legitimate): the ids it lacks decode to nothing, so a word
    the model emits there would vanish from the text without a trace. ``warn=False``: not warned (a caller
    that checked the pair once already). ``fix``: what the error says to do, in the caller's terms (a command
    line's flags); by default the Python calls.
    """
    target_size = getattr(config, "decoder_vocab_size", None) or config.vocab_size
    # a tokenizer of separate vocabularies (MarianTokenizer's separate_vocabs) counts its source side in len()
    if warn and len(tokenizer) < target_size and not getattr(tokenizer, "separate_vocabs", False):
        logger.warning(
            f"The tokenizer has {len(tokenizer)} tokens, fewer than the model's {target_size}: it may not be the "
            f"tokenizer the model was trained with, and ids {len(tokenizer)}..{target_size - 1} decode to nothing."
        )
    problems = []
    for name in SPECIAL_TOKEN_IDS:
        token_id = getattr(tokenizer, name)
        # Not every seq2seq config declares every special id (transformers 5 configs only have the
        # fields they declare): an absent one cannot disagree.
        model_id = getattr(config, name, None)
        if token_id is not None and model_id is not None and token_id != model_id:
            token = tokenizer.convert_ids_to_tokens(token_id)
            problems.append(f"the tokenizer's {token!r} has id {token_id}, but the model's {name} is {model_id}")
    if len(tokenizer) > config.vocab_size:
        problems.append(
            f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size={config.vocab_size}"
        )
    if problems:
        raise ValueError("The tokenizer does not match the model: " + "; ".join(problems) + ". " + fix)


class VanillaTranslationPipeline(Pipeline):
    """Translate text with a sequence-to-sequence model: text in, ``[{"translation_text": ...}]`` out.

    A string gives a list with one dict (more with ``num_return_sequences``); a list of strings gives
    one dict per string (a list of dicts per string with ``num_return_sequences > 1``), and a generator
    or dataset an iterator of them. Batch with ``batch_size=``; padding comes from the tokenizer.

    Call parameters:
        src_lang, tgt_lang: passed to tokenizers that know languages (those with a
            ``_build_translation_inputs`` method, e.g. NLLB, M2M100, mBART); other tokenizers reject them.
        truncation: truncate inputs longer than the tokenizer's ``model_max_length`` or the model's
            ``max_position_embeddings``, whichever is smaller.
        clean_up_tokenization_spaces: passed to ``tokenizer.decode`` (default: off, so that the text
            comes back as the model wrote it).
        return_tensors: return ``{"translation_token_ids": ...}`` instead of text.
        any ``generate()`` parameter, e.g. ``num_beams``, ``max_new_tokens``, ``num_return_sequences``.
    """

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    # No `_default_generation_config`: the model's own generation config (and, for this package's
    # model, generate()'s input length + 50 limit of §6.1) decides how to decode.

    def __init__(self, *args, **kwargs):
        # generate() parameters given here apply to every call. The pipeline keeps them itself: transformers'
        # Pipeline folds them into its own state in a different way from one 5.x release to the next.
        generation_keys = {key for key in vars(GenerationConfig()) if not key.startswith("_")} | {"generation_config"}
        self.generate_kwargs = {key: kwargs.pop(key) for key in generation_keys & kwargs.keys()}
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            raise ValueError(
                f"The {TASK!r} pipeline needs a tokenizer: pass tokenizer=..., or save one next to the model."
            )
        if not self.model.config.is_encoder_decoder:
            raise ValueError(
                f"The {TASK!r} pipeline needs an encoder-decoder model (AutoModelForSeq2SeqLM), got "
                f"{type(self.model).__name__}."
            )
        check_tokenizer_matches_model(self.tokenizer, self.model.config)

    def _sanitize_parameters(
        self,
        src_lang=None,
        tgt_lang=None,
        truncation=None,
        clean_up_tokenization_spaces=None,
        return_tensors=None,
        **generate_kwargs,
    ):
        preprocess_params = {}
        if src_lang is not None or tgt_lang is not None:
            if not hasattr(self.tokenizer, "_build_translation_inputs"):
                raise ValueError(
                    f"src_lang/tgt_lang were given, but {type(self.tokenizer).__name__} has no language codes: "
                    "this model translates in the one direction it was trained for. Remove src_lang and tgt_lang."
                )
            preprocess_params.update(src_lang=src_lang, tgt_lang=tgt_lang)
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        """Translate a string, a list (or tuple) of strings, or an iterable of them (a generator, a dataset column).

        See the class docstring for the parameters.
        """
        if isinstance(inputs, types.GeneratorType):  # transformers < 5.14 reads a generator whole before it starts
            inputs = _Stream(inputs)
        elif isinstance(inputs, tuple):  # sentences, as a list
            inputs = list(inputs)
        if isinstance(inputs, list) and not inputs:  # transformers reads the first item to choose how to run
            return []
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, str):
            return result
        # One dict per sentence, not a one-item list, as the old translation pipeline returned.
        return [_unwrap(records) for records in result] if isinstance(result, list) else map(_unwrap, result)

    def preprocess(self, text: str, src_lang=None, tgt_lang=None, truncation=False):
        if not isinstance(text, str):
            raise TypeError(f"The {TASK!r} pipeline translates strings, got a {type(text).__name__}.")
        blank = torch.tensor([not text.strip()])  # translated as empty, as `translate` leaves a blank line blank
        text = text if text.strip() else ""
        if src_lang is not None or tgt_lang is not None:
            inputs = self.tokenizer._build_translation_inputs(
                text, return_tensors="pt", truncation=truncation, src_lang=src_lang, tgt_lang=tgt_lang
            )
            return {**inputs, "blank": blank}
        # cut at what the model takes too: a tokenizer built in memory keeps its default model_max_length (1024)
        positions = getattr(self.model.config, "max_position_embeddings", None) if truncation else None
        limit = {} if positions is None else {"max_length": min(self.tokenizer.model_max_length, positions)}
        inputs = self.tokenizer(text, truncation=truncation, return_tensors="pt", **limit)
        return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "blank": blank}

    def _forward(self, model_inputs, **generate_kwargs):
        batch_size = model_inputs["input_ids"].shape[0]
        forced_bos = model_inputs.pop("forced_bos_token_id", None)  # the target language, from tgt_lang
        if forced_bos is not None:
            # Batching collects one copy per sentence; they are equal, as the call had one tgt_lang.
            generate_kwargs["forced_bos_token_id"] = forced_bos[0] if isinstance(forced_bos, list) else forced_bos
        if "generation_config" not in generate_kwargs:  # a call's generation_config replaces the pipeline's parameters
            generate_kwargs = {**self.generate_kwargs, **generate_kwargs}
        blank = model_inputs.pop("blank")
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        if not torch.is_tensor(output_ids):  # return_dict_in_generate: the translations are its sequences
            output_ids = output_ids.sequences
        if blank.any():  # a blank text's translation: the start token and </s>, whatever the model made of nothing
            settings = self.model.generation_config
            eos = settings.eos_token_id if settings.eos_token_id is not None else self.tokenizer.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            rows = blank.to(output_ids.device).repeat_interleave(output_ids.shape[0] // batch_size)
            empty = torch.full_like(output_ids[0], eos if settings.pad_token_id is None else settings.pad_token_id)
            empty[0], empty[1:2] = output_ids[0, 0], eos
            output_ids = torch.where(rows[:, None], empty, output_ids)
        # (batch * num_return_sequences, T) -> (batch, num_return_sequences, T), unbatched by the iterator
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def save_pretrained(self, save_directory, **kwargs):
        """Save the model and the tokenizer.

        `Pipeline.save_pretrained` would declare the registered task (``"vanilla-translation"``) in
        config.json, and transformers would then demand ``trust_remote_code=True`` from installed
        users too; this package's model declares ``"translation"`` itself (see the module docstring).
        """
        self.model.save_pretrained(save_directory, **kwargs)
        self.tokenizer.save_pretrained(save_directory, **kwargs)

    def postprocess(self, model_outputs, clean_up_tokenization_spaces=False, return_tensors=False):
        if return_tensors:
            return [{"translation_token_ids": ids} for ids in model_outputs["output_ids"][0]]
        return [
            {
                "translation_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]


class _Stream(IterableDataset):
    """A generator as a dataset without a length, which every transformers 5 pipeline reads as it goes."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def _unwrap(records: list[dict]) -> dict | list[dict]:
    return records[0] if len(records) == 1 else records


__all__ = [
    "CUSTOM_PIPELINES",
    "REMOTE_CODE_TASK",
    "TASK",
    "VanillaTranslationPipeline",
    "check_tokenizer_matches_model",
]
