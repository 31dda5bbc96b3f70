"""Decoding (§6.1) for the Transformer: the paper's length rule and length penalty, and a beam search.

The model class inherits `VanillaTransformerGenerationMixin`, a `GenerationMixin` (as Whisper's
``generation_whisper.py`` does). The model knows nothing about decoding: this module talks to it
through its forward (``logits_to_keep``, the key/value cache) and the cache's public methods. The file
loads as Hub remote code beside the model files (flat imports, no training dependencies).

- `generate()` applies §6.1's limit (each input's length + 50 new tokens), the penalty the generation config
  names (``length_penalty_formula``: GNMT's, the paper's, or transformers' own), and pads what follows
  ``</s>`` with ``<pad>``.
- `BeamSearch` gives transformers' beam-search hypotheses with less work per step; `generate()` takes it
  for the calls it serves (`BeamSearch.not_covered` says which) and transformers' `_beam_search` for the rest.

The private members of transformers this relies on (``_beam_search``, the two steps of beam search that
the GNMT penalty rescales, ``config._attn_implementation``) are checked when this module is imported
(`private_api.require`), so that a transformers release without them fails here, naming them and the
tested releases, not in the middle of `generate()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import numbers
import os

import torch
from huggingface_hub import try_to_load_from_cache
from torch import nn
from transformers import CompileConfig, GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.utils import logging

from .private_api import require

require(
    "transformers.GenerationMixin._beam_search",
    "transformers.GenerationMixin._update_finished_beams",
    "transformers.GenerationMixin._check_early_stop_heuristic",
    "transformers.PretrainedConfig._attn_implementation",
)

logger = logging.get_logger(__name__)
GENERATION_CONFIG_FILE = "generation_config.json"
_COMPILED_FORWARDS: dict = {}  # model class -> [(CompileConfig, its forward compiled)] (`_compiled_forward`)

# transformers 5.24 renamed the key/value cache `past_key_values` -> `cache` in generate()'s model
# kwargs, in forward arguments and in model outputs: the installed version's name.
CACHE = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"

# §6.1: "We set the maximum output length during inference to input length + 50". Kept in the
# generation config under this name, so that it is saved, visible and can be changed or switched off.
MAX_NEW_TOKENS_BEYOND_INPUT = "max_new_tokens_beyond_input"
MAX_EXTRA_OUTPUT_TOKENS = 50
# §6.1's "length penalty alpha = 0.6" is GNMT's (Wu et al., 2016, eq. 14): a finished hypothesis Y scores
# log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha, as tensor2tensor computed it. transformers' beam
# search divides by |Y| ** alpha instead. The generation config says which: "gnmt" (the paper's) or
# "length" (transformers' and CTranslate2's); a config without the field is transformers' own.
LENGTH_PENALTY_FORMULA = "length_penalty_formula"
LENGTH_PENALTY_FORMULAS = ("gnmt", "length")

# The penalty of the generate() call running in this thread (or task): read by the two scoring steps of
# beam search below, set by `generate()` for the length of one call.
_GNMT_PENALTY: contextvars.ContextVar[bool] = contextvars.ContextVar("gnmt_length_penalty", default=False)


def paper_generation_config(config) -> GenerationConfig:
    """Decoding as in §6.1: beam size 4, GNMT's length penalty with alpha = 0.6, stop when 4 hypotheses
    end, and at most input length + 50 new tokens (``max_new_tokens_beyond_input``, applied by `generate()`)."""
    return GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        early_stopping=True,
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        **{MAX_NEW_TOKENS_BEYOND_INPUT: MAX_EXTRA_OUTPUT_TOKENS, LENGTH_PENALTY_FORMULA: "gnmt"},
    )


def _has_generation_file(pretrained, kwargs: dict) -> bool:
    """Whether the folder or Hub repo a model was loaded from holds generation_config.json; a Hub repo the cache
    knows nothing of counts as holding it (transformers' reading stands)."""
    name = os.path.join(kwargs.get("subfolder") or "", GENERATION_CONFIG_FILE)
    if os.path.isdir(pretrained):
        return os.path.isfile(os.path.join(pretrained, name))
    found = try_to_load_from_cache(str(pretrained), name, kwargs.get("cache_dir"), kwargs.get("revision"))
    return found is None or isinstance(found, str)  # else the cache's record that the repo has no such file


def penalty_formula_of(generation_config: GenerationConfig) -> str:
    """The length penalty a saved generation config decodes with: its ``length_penalty_formula``, else "length"."""
    return getattr(generation_config, LENGTH_PENALTY_FORMULA, None) or "length"


def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha, with |Y| the generated tokens, </s> included (GNMT, eq. 14)."""
    return ((5 + length) / 6) ** alpha


def pad_after_end_of_sequence(
    sequences: torch.Tensor, eos_token_id: int | list[int], pad_token_id: int, prompt_length: int = 0
) -> torch.Tensor:
    """Every token after a row's first generated end of sequence (``</s>``, or any of a list of ids) becomes
    ``<pad>``; the decoder prompt's first ``prompt_length`` columns are not looked at (a model may start
    decoding with ``</s>``, as fairseq's do).

    Beam search in transformers fills finished rows with ``pad_token_id or eos_token_id``, so a pad
    id of 0 (falsy) fills them with ``</s>``, and whoever counts non-pad tokens (the Trainer's
    ``gen_len``) counts the filler too.
    """
    ends = torch.isin(sequences, torch.as_tensor(eos_token_id, device=sequences.device))
    ends[:, :prompt_length] = False
    ended_before = ends.long().cumsum(dim=-1) - ends.long()
    return sequences.masked_fill(ended_before > 0, pad_token_id)


# ---------------------------------------------------------------------------------------------
# generate(): §6.1's length rule and length penalty
# ---------------------------------------------------------------------------------------------


class VanillaTransformerGenerationMixin(GenerationMixin):
    """`GenerationMixin` with §6.1's decoding: the length rule, GNMT's length penalty and `BeamSearch`."""

    def adjust_generation_fn(self, generation_config, from_auto_class, from_pipeline, pretrained, *args, **kwargs):
        """`from_pretrained`'s reading of generation_config.json. Where a folder has none, transformers builds a
        config from config.json (greedy, no length rule); this model decodes as §6.1 says instead. A file that
        is there is taken as written, ``"_from_model_config": true`` (a MarianMT's) included."""
        super().adjust_generation_fn(generation_config, from_auto_class, from_pipeline, pretrained, *args, **kwargs)
        if generation_config is None and pretrained is not None and not _has_generation_file(pretrained, kwargs):
            logger.info("no generation_config.json: decoding as the paper does (beam 4, GNMT alpha 0.6, source + 50)")
            self.generation_config = paper_generation_config(self.config)

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs):
        """`GenerationMixin.generate` with the paper's length limit (§6.1) and outputs padded with ``<pad>``.

        Length, first match wins (`_extra_tokens`): ``max_length`` or ``max_new_tokens`` in the call; else the
        paper's rule, at most (the source's length) + ``max_new_tokens_beyond_input`` (50) new tokens after
        the decoder prompt, capped by ``max_position_embeddings``, where the call, the ``generation_config``
        passed or the model's says so. The rule is each sentence's own (its length from the source's mask,
        `SourceLengthCriteria`), so a hypothesis is cut where it would be decoded alone, whatever else is in
        the batch. It beats the ``max_length`` stored with it (`save_pretrained`'s, or the default of 20 that
        ``Seq2SeqTrainer`` sets as a side effect of evaluating); set ``max_new_tokens_beyond_input = None``
        to use ``max_length``. A source without an ``attention_mask`` gets one from its ``<pad>`` tokens, as
        transformers does for decoder-only models only; one padded on the left is refused (`_source_lengths`).
        The length penalty is the call's ``length_penalty_formula`` ("gnmt" or "length"), else the
        generation config's. ``labels`` (which ``Seq2SeqTrainer`` passes with the source) are dropped, as
        transformers' own loop ignores them, so that `BeamSearch` serves an evaluation too.
        """
        kwargs.pop("labels", None)  # Seq2SeqTrainer passes an evaluation's references along; decoding never reads them
        prompt = self._prompt_length(generation_config, kwargs)
        self._check_length_fits(GenerationConfig(), kwargs, prompt)  # the call's own length, in its own terms
        extra = self._extra_tokens(generation_config, kwargs)  # the rule's, or None
        if extra is not None and (isinstance(extra, bool) or not isinstance(extra, numbers.Integral) or extra < 0):
            raise ValueError(
                f"{MAX_NEW_TOKENS_BEYOND_INPUT}={extra!r}: give a whole number of new tokens beyond the source's "
                f"length, 0 or more (§6.1 uses 50), or None to decode to max_length / max_new_tokens instead."
            )
        mask = _source_mask(inputs, kwargs, self._setting(generation_config, "pad_token_id", kwargs))
        if mask is not None and mask.shape[0] == 0:
            raise ValueError("generate() got a batch of 0 sources: give at least one sentence.")
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        vocabulary = self.get_input_embeddings().num_embeddings
        lengths, shortest = (None, None) if mask is None else _source_lengths(mask, ids, vocabulary)  # refusals
        if mask is not None and "attention_mask" not in kwargs and shortest < mask.shape[1]:
            kwargs["attention_mask"] = mask  # <pad> in the source: the encoder leaves it out, as the sentence alone
        limit, each_sentence = None, None
        if extra is not None and (width := _source_length(inputs, kwargs)) is not None:
            limit = min(width + extra, self.config.max_position_embeddings - prompt)  # new tokens, for the batch
            if shortest is not None and shortest + extra < limit:  # §6.1's limit is each sentence's
                each_sentence = SourceLengthCriteria(torch.clamp(lengths + extra, max=limit) + prompt)
                criteria = [*(kwargs.get("stopping_criteria") or []), each_sentence]
                kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
                if self._setting(generation_config, "forced_eos_token_id", kwargs) is not None:
                    logger.warning_once(
                        "forced_eos_token_id forces </s> at the batch's length limit, not at each sentence's (§6.1's "
                        "source length + 50): a sentence of this batch cut at its own limit ends without it, unlike "
                        "decoded alone. Decode such sentences one by one, or set max_new_tokens_beyond_input=None."
                    )
        # A max_new_tokens in the call beats a max_length that only caps the rule (save_pretrained's, or the
        # Trainer's 20); given to transformers as the max_length it means, since with both set it warns.
        holder = generation_config or self.generation_config
        if (
            extra is None
            and kwargs.get("max_new_tokens") is not None
            and kwargs.get("max_length") is None
            and getattr(holder, MAX_NEW_TOKENS_BEYOND_INPUT, None) is not None
            and holder.max_length is not None
        ):
            limit = kwargs.pop("max_new_tokens")
        if limit is not None:  # as a max_length (the prompt + limit), which wins over the model's own
            ours = generation_config is None
            generation_config = copy.deepcopy(generation_config or self.generation_config)
            if ours:  # the call's settings go into our copy (transformers warns when given a config and settings);
                # None (unset a default) and cache_implementation="paged" (which generate() reads from the call, to
                # switch to continuous batching) stay in the call
                settings = [
                    k for k, v in kwargs.items() if v is not None and (k, v) != ("cache_implementation", "paged")
                ]
                kwargs.update(generation_config.update(**{k: kwargs.pop(k) for k in settings}))
            generation_config.max_length, generation_config.max_new_tokens = limit + prompt, None
        self._check_length_fits(generation_config or self.generation_config, kwargs, prompt)
        formula = kwargs.pop(LENGTH_PENALTY_FORMULA, None) or self._setting(generation_config, LENGTH_PENALTY_FORMULA)
        if formula not in (None, *LENGTH_PENALTY_FORMULAS):
            raise ValueError(
                f"{LENGTH_PENALTY_FORMULA}={formula!r}: use 'gnmt' (the paper's) or 'length' (transformers')."
            )
        penalty = _GNMT_PENALTY.set(formula == "gnmt")  # this call's, in this thread only
        try:
            output = super().generate(inputs, generation_config, **kwargs)
        finally:
            _GNMT_PENALTY.reset(penalty)
        eos, pad = (self._setting(generation_config, name, kwargs) for name in ("eos_token_id", "pad_token_id"))
        sequences = output if torch.is_tensor(output) else output.sequences
        if each_sentence is not None and pad is not None:  # beam search fills a cut hypothesis' end with </s>
            sequences = each_sentence.pad_beyond(sequences, pad)
        if eos is not None and torch.as_tensor(eos).numel() and pad is not None:  # pad what follows </s> (see above)
            sequences = pad_after_end_of_sequence(sequences, eos, pad, prompt_length=prompt)
        if torch.is_tensor(output):
            return sequences
        output.sequences = sequences
        return output

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, with a generation config whose ``max_length`` tells readers that
        do not know the length rule (CTranslate2's converter, serving stacks) no shorter limit than the rule's.

        ``Seq2SeqTrainer`` leaves transformers' default ``max_length`` of 20 on the model's generation config
        after evaluating; `generate()` ignores it under the rule, other readers would cut every output at 20
        tokens. Saved instead: the rule's own bound, ``max_position_embeddings`` (the start token and at most
        ``max_position_embeddings - 1`` new tokens), beside ``max_new_tokens_beyond_input``.
        """
        config = self.generation_config
        if getattr(config, MAX_NEW_TOKENS_BEYOND_INPUT, None) is None or config.max_new_tokens is not None:
            return super().save_pretrained(save_directory, *args, **kwargs)
        self.generation_config = copy.deepcopy(config)
        self.generation_config.max_length = self.config.max_position_embeddings
        try:
            return super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            self.generation_config = config

    def _prompt_length(self, generation_config: GenerationConfig | None, kwargs: dict) -> int:
        """The decoder prompt's length as transformers decodes it: the call's ``decoder_input_ids`` (1 without),
        one longer where no row starts with the start token, which transformers then puts in front."""
        prompt = kwargs.get("decoder_input_ids")
        if prompt is None:
            return 1
        start = self._setting(generation_config, "decoder_start_token_id", kwargs)
        start = self._setting(generation_config, "bos_token_id", kwargs) if start is None else start
        if isinstance(start, int) and prompt.shape[1] > 0 and bool((prompt[:, 0] != start).all()):
            return prompt.shape[1] + 1
        return prompt.shape[1]

    def _setting(self, generation_config: GenerationConfig | None, name: str, kwargs: dict | None = None):
        """A generation setting: the call's, else the passed config's, else the model's (as `generate()`
        merges them)."""
        for value in ((kwargs or {}).get(name), getattr(generation_config, name, None)):
            if value is not None:
                return value
        return getattr(self.generation_config, name, None)

    def _extra_tokens(self, generation_config: GenerationConfig | None, kwargs: dict) -> int | None:
        """The rule's new tokens beyond the source's length (``max_new_tokens_beyond_input``), taken out of the
        call's ``kwargs``; None where a length applies instead or the rule is off. First match wins: a
        ``max_length`` or ``max_new_tokens`` in the call; the rule's setting in the call; the passed
        ``generation_config``'s (a ``max_new_tokens`` there, else its rule's setting, else a ``max_length``
        there); the model's ``max_new_tokens``; the model's rule (whose ``max_length`` only caps it: as
        `save_pretrained` writes it, or as ``Seq2SeqTrainer`` leaves it)."""
        given = kwargs.pop(MAX_NEW_TOKENS_BEYOND_INPUT, _NOT_GIVEN)
        if any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens")):
            return None
        if given is not _NOT_GIVEN:
            return given
        if generation_config is not None:
            if generation_config.max_new_tokens is not None:
                return None
            if hasattr(generation_config, MAX_NEW_TOKENS_BEYOND_INPUT):
                return getattr(generation_config, MAX_NEW_TOKENS_BEYOND_INPUT)
            if generation_config.max_length is not None:
                return None
        if self.generation_config.max_new_tokens is not None:  # set on the model's config by the user
            return None
        # A generation config saved before the field existed gets the paper's rule too.
        return getattr(self.generation_config, MAX_NEW_TOKENS_BEYOND_INPUT, MAX_EXTRA_OUTPUT_TOKENS)

    def _check_length_fits(self, generation_config: GenerationConfig, kwargs: dict, prompt: int) -> None:
        """Refuse, before decoding, a length the positional encoding cannot reach (the decoder's first
        ``prompt`` positions hold the start token, or the call's decoder prompt: `_prompt_length`)."""
        new_tokens = kwargs.get("max_new_tokens", generation_config.max_new_tokens)
        total = kwargs.get("max_length", generation_config.max_length)
        positions = self.config.max_position_embeddings
        if (new_tokens is not None and prompt + new_tokens > positions) or (
            new_tokens is None and total and total > positions
        ):
            asked = f"max_new_tokens={new_tokens}" if new_tokens is not None else f"max_length={total}"
            held = "one of them for the start token" if prompt == 1 else f"{prompt} of them for the decoder prompt"
            raise ValueError(
                f"{asked} is more than this model can generate: max_position_embeddings={positions} positions, "
                f"{held}. Ask for at most {positions - prompt} new tokens, or raise max_position_embeddings in the "
                "config (sinusoidal positions need no retraining)."
            )

    # -- the hooks of transformers' beam search ----------------------------------------------------

    def _beam_search(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
    ):
        """generate()'s beam search: `BeamSearch` where it covers the call, else transformers' own."""
        reason = BeamSearch.not_covered(
            self, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
        )
        if reason is None:
            return BeamSearch(
                self, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs
            ).run()
        _log_once(f"beam search: transformers' own loop, because {reason}")
        with self._compiled_forward(model_kwargs, generation_config):
            return super()._beam_search(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
            )

    @contextlib.contextmanager
    def _compiled_forward(self, model_kwargs: dict, generation_config: GenerationConfig):
        """The decoding steps compiled while transformers' beam search runs, where transformers compiles those of
        greedy search and sampling (its ``_valid_auto_compile_criteria``: a static cache, on CUDA or with a
        `CompileConfig` for every device), with ``generation_config.compile_config`` (by default transformers',
        CUDA graphs on CUDA): transformers compiles no step of beam search. As there, the first step (`_prefill`)
        runs uncompiled: it creates the cache's buffers and marks them for CUDA graphs, which a traced step would
        not. The steps after it decode the same shape (one position a beam over the cache's fixed length), so one
        graph serves them; `_reorder_cache` keeps the cache's buffers where the graph reads them. A forward the
        user replaced (compiled themselves) is left as it is. Not for two threads decoding with one model at once
        (the compiled forward is the model's while a call lasts). Not where the call returns attentions or hidden
        states (``return_dict_in_generate``): beam search keeps each step's, and a CUDA graph's replay overwrites
        the last one's outputs (torch then refuses to read them); those calls decode uncompiled."""
        criteria = getattr(self, "_valid_auto_compile_criteria", None)  # transformers 5.10.1 - 5.24.0
        keeps_outputs = generation_config.return_dict_in_generate and (
            generation_config.output_attentions or generation_config.output_hidden_states
        )
        if (
            "forward" in vars(self)
            or criteria is None
            or keeps_outputs
            or not criteria(model_kwargs, generation_config)
        ):
            yield
            return
        default = getattr(self, "_default_compile_config", CompileConfig)  # transformers' per device
        config = generation_config.compile_config or default()
        compiled = _COMPILED_FORWARDS.setdefault(type(self), [])  # [(config, the class's forward compiled)]
        found = next((function for known, function in compiled if known == config), None)
        if found is None:  # compiled once per class and configuration; the model is an argument, not held
            found = torch.compile(type(self).forward, **config.to_dict())
            compiled.append((config, found))
        step = functools.partial(found, self)
        self._compiled_step = step  # installed by `_prefill`, after the first step
        try:
            yield
        finally:
            vars(self).pop("_compiled_step", None)
            if vars(self).get("forward") is step:  # the class's own again
                del self.forward

    def _prefill(self, *args, **kwargs):
        """transformers' first decoding step, uncompiled, then the compiled steps of `_compiled_forward` after it."""
        outputs = super()._prefill(*args, **kwargs)
        step = vars(self).pop("_compiled_step", None)
        if step is not None:
            self.forward = step
        return outputs

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """transformers' beam search reorders the cache through this where the model has it (else through the
        cache's ``reorder_cache``, which also reorders cross-attention's): the cross-attention keys and values
        are the same for every beam of a sentence, so only self-attention's are reordered. A static cache in
        place (the cache's own reorder makes new tensors): a compiled step's CUDA graphs read its buffers where
        they were when the graph was recorded."""
        if not isinstance(cache.self_attention_cache, StaticCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
            return cache
        for layer in cache.self_attention_cache.layers:
            if getattr(layer, "is_initialized", False):
                rows = beam_idx.to(layer.keys.device)
                layer.keys.copy_(layer.keys.index_select(0, rows))
                layer.values.copy_(layer.values.index_select(0, rows))
        return cache

    # Beam search (transformers' `_beam_search`, and `BeamSearch`) divides a finished hypothesis'
    # log-probability by length ** length_penalty in these two steps; for GNMT's penalty they get the
    # log-probabilities rescaled by length ** alpha / lp(length), so that the division leaves log P / lp.

    def _update_finished_beams(self, *, topk_log_probs, cur_len, decoder_prompt_len, length_penalty, **kwargs):
        if _GNMT_PENALTY.get():
            length = cur_len + 1 - decoder_prompt_len
            topk_log_probs = topk_log_probs * (length**length_penalty / gnmt_length_penalty(length, length_penalty))
        return super()._update_finished_beams(
            topk_log_probs=topk_log_probs,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty,
            **kwargs,
        )

    def _check_early_stop_heuristic(
        self, *, running_beam_scores, cur_len, max_length, decoder_prompt_len, early_stopping, length_penalty, **kwargs
    ):
        if _GNMT_PENALTY.get():  # the same hypothetical length as transformers' heuristic
            length = max_length if early_stopping == "never" and length_penalty > 0.0 else cur_len
            length -= decoder_prompt_len
            running_beam_scores = running_beam_scores * (
                length**length_penalty / gnmt_length_penalty(length, length_penalty)
            )
        return GenerationMixin._check_early_stop_heuristic(
            running_beam_scores=running_beam_scores,
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
            **kwargs,
        )


class SourceLengthCriteria(StoppingCriteria):
    """§6.1's length limit per sentence: a row stops once it holds ``max_lengths[sentence]`` tokens (the start
    token included), as `MaxLengthCriteria` stops a batch of that sentence alone. The rows of a call come
    sentence by sentence, the same number for each (beams, candidates or returned sequences)."""

    def __init__(self, max_lengths: torch.Tensor):
        self.max_lengths = max_lengths  # (sentences,)

    def limits(self, sentences: torch.Tensor) -> torch.Tensor:
        """The limits of these sentences (by batch position)."""
        return self.max_lengths[sentences]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs) -> torch.BoolTensor:
        return input_ids.shape[1] >= self._per_row(input_ids)

    def pad_beyond(self, sequences: torch.LongTensor, pad_token_id: int) -> torch.LongTensor:
        """``sequences`` (the call's output) with ``pad_token_id`` past each sentence's limit, where beam search
        fills the end of a hypothesis cut there, in a batch decoded further."""
        beyond = torch.arange(sequences.shape[1], device=sequences.device) >= self._per_row(sequences)[:, None]
        return sequences.masked_fill(beyond, pad_token_id)

    def _per_row(self, rows: torch.Tensor) -> torch.Tensor:
        rows_per_sentence = rows.shape[0] // self.max_lengths.shape[0]
        return self.max_lengths.to(rows.device).repeat_interleave(rows_per_sentence)


_NOT_GIVEN = object()


def _source_mask(inputs: torch.Tensor | None, kwargs: dict, pad_token_id: int | None) -> torch.Tensor | None:
    """The source's padding mask (B, S): the call's ``attention_mask``, else the ``input_ids`` that are not
    ``<pad>`` (which our tokenizer never makes of text); None where neither says."""
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    mask = kwargs.get("attention_mask")
    if mask is None and input_ids is not None and pad_token_id is not None and input_ids.dim() == 2:
        mask = input_ids.ne(pad_token_id).long()
    return mask if mask is not None and mask.dim() == 2 and mask.shape[1] > 0 else None  # empty: the model says


def _source_lengths(
    mask: torch.Tensor, input_ids: torch.Tensor | None = None, vocabulary: int | None = None
) -> tuple[torch.Tensor, int]:
    """Each source's length (B,) and the shortest one's. A source padded on the left would put its first token
    at a later position (§3.5's positions count from each row's first column, as MarianMT's do) and translate
    differently: refused; so are ``input_ids`` outside a ``vocabulary`` of that many ids (another model's
    tokenizer: an IndexError inside the embedding, a device-side assert on a GPU). One host-device
    synchronisation for all of it."""
    lengths = mask.sum(dim=-1)
    checks = [lengths.min(), ((mask[:, 0] == 0) & (lengths > 0)).sum()]
    check_ids = torch.is_tensor(input_ids) and not input_ids.is_floating_point() and vocabulary is not None
    if check_ids:
        outside = (input_ids < 0) | (input_ids >= vocabulary)
        checks.append(outside.sum())
    shortest, left_padded, *unknown = torch.stack([check.to(checks[0].dtype) for check in checks]).tolist()
    if shortest == 0:  # alone, the encoder refuses it; in a batch, each attention kernel made something else of it
        raise ValueError(
            f"Source {int(lengths.argmin())} of the batch has no token (its attention_mask is all 0): every source "
            "needs at least one, e.g. the </s> that the tokenizer appends to every sentence, blank ones included."
        )
    if unknown and unknown[0]:
        raise ValueError(
            f"The source holds token id {int(input_ids[outside][0])}, outside this model's vocabulary of "
            f"{vocabulary} tokens: it was tokenized by another model's tokenizer. Load the tokenizer saved with the "
            "model (AutoTokenizer.from_pretrained on the same folder or repo)."
        )
    if left_padded:
        raise ValueError(
            f"{left_padded} source(s) are padded on the left (attention_mask starts with 0): the encoder's "
            "positions start at each row's first column, so pad on the right (tokenizer.padding_side = 'right', "
            "the tokenizer's default)."
        )
    return lengths, int(shortest)


def _source_length(inputs: torch.Tensor | None, kwargs: dict) -> int | None:
    """Length of the (padded) source batch, from whichever form the source was given in."""
    if inputs is not None:
        return inputs.shape[1]
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            return kwargs[name].shape[1]
    encoder_outputs = kwargs.get("encoder_outputs")
    if encoder_outputs is not None:
        return encoder_outputs[0].shape[1]
    return None


_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    """A debug message, once per process for each text."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.debug(message)


# ---------------------------------------------------------------------------------------------
# §6.1 Beam search: transformers' algorithm and hypotheses, with less work per step
# ---------------------------------------------------------------------------------------------


def top_tokens(log_probs: torch.Tensor, keep: int, block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(log_probs, keep)`` over the vocabulary (rows, V): the same scores, best first, and their tokens.

    On the CPU, torch's top-k over a long row costs about twice a log-softmax over it, while a plain maximum
    costs a tenth of one. A row's best ``keep`` tokens lie in the ``keep`` blocks of ``block`` tokens with the
    highest maxima (a block holding one of them has a maximum at least as high), so this takes one maximum
    per block and a top-k over those blocks' ``keep * block`` tokens (and the last, partial block). Where
    scores are exactly equal, which of them comes first may differ from torch.topk, which promises no order.
    """
    rows, vocab = log_probs.shape
    blocks = vocab // block
    if log_probs.device.type != "cpu" or blocks <= 2 * keep:  # GPUs' top-k is fast; short rows gain nothing
        return torch.topk(log_probs, keep)
    body = log_probs[:, : blocks * block].view(rows, blocks, block)
    best_blocks = body.amax(dim=-1).topk(keep).indices  # (rows, keep)
    candidates = body.gather(1, best_blocks[:, :, None].expand(-1, -1, block)).flatten(1)  # (rows, keep * block)
    tokens = (best_blocks[:, :, None] * block + torch.arange(block, device=log_probs.device)).flatten(1)
    if blocks * block < vocab:  # the partial block at the end
        candidates = torch.cat([candidates, log_probs[:, blocks * block :]], dim=1)
        tail = torch.arange(blocks * block, vocab, device=log_probs.device).expand(rows, -1)
        tokens = torch.cat([tokens, tail], dim=1)
    scores, picked = candidates.topk(keep)
    return scores, tokens.gather(1, picked)


def best_continuations(
    log_probs: torch.Tensor, beam_scores: torch.Tensor, keep: int, blocks: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``keep`` best (beam, token) continuations of each sentence, best first: scores, beams, tokens (B, keep).

    generate() adds each beam's score to all V of its token log-probabilities and takes the top ``keep``
    of those B x (beams * V) sums. A sentence's best ``keep`` can only come from each beam's best ``keep``
    tokens, so those are all this adds: the same sums, beams x keep of them instead of beams x V.
    ``log_probs`` has a row per beam (B * beams, V), or one per sentence (B, V) when its beams are still
    copies of each other (the first step). ``blocks``: each row's best tokens by `top_tokens`, else by
    ``torch.topk`` (scores with many exact ties, whose order `top_tokens` may not keep).
    """
    sentences, beams = beam_scores.shape
    token_scores, tokens = (
        top_tokens(log_probs, keep) if blocks else torch.topk(log_probs, keep)
    )  # (B * beams or B, keep)
    token_scores, tokens = (t.view(sentences, -1, keep).expand(sentences, beams, keep) for t in (token_scores, tokens))
    sums = (token_scores + beam_scores[:, :, None]).reshape(sentences, beams * keep)
    scores, picked = torch.topk(sums, keep)  # (B, keep)
    return scores, picked // keep, tokens.reshape(sentences, beams * keep).gather(1, picked)


# Logits processors that treat every row on its own (no batch index, no per-sentence state): with them,
# leaving a finished sentence's rows out of the batch changes nothing for the other rows.
ROW_WISE_PROCESSORS = (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    SuppressTokensLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)
ROW_WISE_CRITERIA = (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria, SourceLengthCriteria)


class BeamSearch:
    """`GenerationMixin._beam_search` (transformers 5) for this model: the same candidates, scores and
    hypotheses, with less work per step. Its bookkeeping of finished hypotheses (`_update_finished_beams`, and
    `_check_early_stop_heuristic` where it can matter) is transformers' own, called on the model so that the
    GNMT penalty applies; what differs is how much the model and the vocabulary-sized tensors cost:

    - the first step runs the decoder on one row per sentence (its beams are copies of each other), so
      cross-attention keys and values are projected once per sentence; they stay one row per sentence,
      shared by its beams (the model's `share_keys`), so they are read once per step and never reordered;
    - a sentence whose hypotheses can no longer change (all its beams finished, and early stopping or
      no possible improvement) leaves the batch; generate() keeps decoding it until the last one ends;
    - the best continuations come from each beam's best tokens (`best_continuations`) instead of a
      (B, beams * V) tensor of sums, and the logits are not copied first;
    - the cross-attention mask is made once per batch, not at every step;
    - a hypothesis' beam indices are kept as their count, all that the output (a tensor, not a dict) needs;
    - for the paper's decoding (``lean``: early stopping, no logits processor) the finished-beam merge runs
      only at the steps where a top candidate ends, and the early-stop heuristic never.

    Why ``lean`` gives the same hypotheses: with early stopping, a sentence leaves the batch as soon as all its
    beams hold a finished hypothesis, so for every sentence still in it the early-stop heuristic holds (it fails
    only once every beam has one), and `_update_finished_beams` adds nothing to the scores of its candidates but
    -1e9 to those that did not just end. A step where no top candidate ends therefore changes only slots that
    hold no finished hypothesis: they rank below every finished one, and without logits processors (no -inf
    scores) the search always ends with finished hypotheses in the returned slots.

    `not_covered` says which calls it serves; the rest go to transformers' `_beam_search`. At most two host-device
    synchronisations per step, as in transformers' loop.
    """

    @staticmethod
    def not_covered(model, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs):
        """None for a call this search serves, else the reason it does not."""
        cache, encoder_outputs = model_kwargs.get(CACHE), model_kwargs.get("encoder_outputs")
        checks = {
            "it samples, returns a dict, syncs GPUs, prefills in chunks or asks for low_memory": not (
                generation_config.do_sample
                or getattr(generation_config, "low_memory", None)  # transformers' beam search refuses it
                or generation_config.return_dict_in_generate
                or synced_gpus
                or generation_config.prefill_chunk_size is not None
            ),
            f"the call passes model arguments beyond the source ({sorted(model_kwargs)})": set(model_kwargs)
            <= {"attention_mask", "encoder_outputs", CACHE, "use_cache", "logits_to_keep"},
            "the cache is off, not a fresh dynamic one, or the user's": bool(model_kwargs.get("use_cache"))
            and type(cache) is EncoderDecoderCache
            and type(cache.self_attention_cache) is DynamicCache
            and not getattr(cache, "_is_user_defined", False)
            and cache.get_seq_length() == 0,
            "the encoder outputs carry more than the last hidden state": isinstance(encoder_outputs, BaseModelOutput)
            and list(encoder_outputs.keys()) == ["last_hidden_state"],
            "a logits processor or stopping criterion may look across rows": all(
                type(processor) in ROW_WISE_PROCESSORS for processor in logits_processor
            )
            and all(type(criterion) in ROW_WISE_CRITERIA for criterion in stopping_criteria),
            "the attention implementation takes no tensor mask": model.config._attn_implementation in ("eager", "sdpa"),
            "it keeps more candidates per beam than the vocabulary has tokens": BeamSearch.candidates(generation_config)
            <= model.config.decoder_vocab_size,
        }
        return next((reason for reason, holds in checks.items() if not holds), None)

    @staticmethod
    def candidates(generation_config) -> int:
        """Candidates kept per sentence at each step, as `_beam_search` keeps them: two per beam, or one more than
        the end tokens, so that enough continue when some end."""
        end_tokens, _ = end_and_fill_tokens(generation_config)
        return max(2, 1 + end_tokens) * generation_config.num_beams

    def __init__(self, model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        self.model, self.config = model, generation_config
        self.logits_processor = logits_processor
        # the per-sentence limits read the sentences' batch positions, which change as sentences leave
        self.sentence_limits = [c for c in stopping_criteria if isinstance(c, SourceLengthCriteria)]
        self.stopping_criteria = StoppingCriteriaList(
            [c for c in stopping_criteria if not isinstance(c, SourceLengthCriteria)]
        )
        self.beams = generation_config.num_beams
        self.lean = generation_config.early_stopping is True and not logits_processor  # the paper's decoding
        _, self.fill = end_and_fill_tokens(generation_config)
        self.keep = BeamSearch.candidates(generation_config)
        self.top_beams_mask = torch.arange(self.keep, device=input_ids.device) < self.beams
        sentences, self.prompt_length = input_ids.shape[0] // self.beams, input_ids.shape[1]
        self.length = self.prompt_length
        self.row_offsets = torch.arange(sentences, device=input_ids.device)[:, None] * self.beams  # first row
        # generate() repeated the source for every beam: one row per sentence is all the decoder needs
        self.encoder_hidden_states = model_kwargs["encoder_outputs"].last_hidden_state[:: self.beams]  # (B, S, d)
        source_mask = model_kwargs.get("attention_mask")
        # the decoder's cross-attention mask, made once (the decoder would make it again at every step):
        # (B, 1, 1, S) is the same for every query position and beam, so it serves every step
        self.attention_mask = create_bidirectional_mask(
            config=model.config,
            inputs_embeds=self.encoder_hidden_states[:, :1],
            encoder_hidden_states=self.encoder_hidden_states,
            attention_mask=source_mask[:: self.beams] if source_mask is not None else None,
        )
        self.cache = model_kwargs[CACHE]  # generate()'s, empty
        self.sentence_ids = torch.arange(sentences, device=input_ids.device)  # batch position of each kept sentence
        self.state = self._initial_state(input_ids, sentences)
        self.result = {name: self.state[name].clone() for name in ("sequences", "generated")}

    def _initial_state(self, input_ids: torch.Tensor, sentences: int) -> dict[str, torch.Tensor]:
        """The tensors `_beam_search` starts from, with the same fill values; where it keeps a finished
        hypothesis' beam indices, ``generated`` keeps their count (what `run` crops the output by)."""
        device, shape, beams = input_ids.device, (sentences, self.beams), self.beams
        running_sequences = torch.full((*shape, self.config.max_length), self.fill, dtype=torch.long, device=device)
        running_sequences[:, :, : self.length] = input_ids.view(sentences, beams, -1)
        running_beam_scores = torch.zeros(shape, device=device)
        running_beam_scores[:, 1:] = -1.0e9  # only the first beam's continuations count at the first step
        return {
            "running_sequences": running_sequences,
            "running_beam_scores": running_beam_scores,
            "sequences": running_sequences.clone(),
            "beam_scores": torch.full(shape, -1.0e9, device=device),
            "generated": torch.zeros((*shape, 1), dtype=torch.long, device=device),
            "is_sent_finished": torch.zeros(shape, dtype=torch.bool, device=device),
            "is_early_stop_heuristic_unsatisfied": torch.ones((sentences, 1), dtype=torch.bool, device=device),
        }

    def run(self) -> torch.LongTensor:
        while self._step():
            pass
        self._store(torch.ones_like(self.sentence_ids, dtype=torch.bool))
        returned = self.config.num_return_sequences
        sequences = self.result["sequences"][:, :returned].flatten(0, 1)
        # as `_beam_search` crops its output: to the most generated tokens among the returned hypotheses
        return sequences[:, : self.prompt_length + self.result["generated"][:, :returned].max()]

    def _step(self) -> bool:
        """One step of `_beam_search`: decode, merge the candidates that ended into the finished hypotheses, let
        the best that did not end go on, and let the sentences that are done leave. Says whether to go on."""
        first = self.length == self.prompt_length
        scores, beam, token = self._continuations(first)  # (B, keep) each, best first
        hits = self._hits(token)
        merge = go_on = True
        if self.lean:  # one host-device synchronisation: a top candidate ended; not all did (the length limit)
            merge, go_on = torch.stack([(hits & self.top_beams_mask).any(), ~hits.all()]).tolist()
        if merge:
            self._update_finished_beams(scores, beam, token, hits)
        if not go_on:
            return False
        parent = self._continue_best(scores, beam, token, hits)
        self.length += 1
        if not self.lean:  # one host-device synchronisation, as `_beam_search_has_unfinished_sequences`
            go_on = bool(self._check_early_stop_heuristic().any() & ~hits.all())
        return go_on and self._follow_beams(parent + self.row_offsets, first, leave=merge)

    def _continue_best(self, scores, beam, token, hits) -> torch.Tensor:
        """The best ``beams`` candidates that did not end become the running beams, as in transformers'
        `_get_running_beams_for_next_iteration`; returns each one's parent beam (B, beams)."""
        state = self.state
        running_scores = scores + hits.to(torch.float32) * -1.0e9
        picked = torch.topk(running_scores, k=self.beams)[1]
        parent = beam.gather(1, picked)
        state["running_sequences"] = gather_beams(state["running_sequences"], parent)
        state["running_sequences"][:, :, self.length] = token.gather(1, picked)
        state["running_beam_scores"] = running_scores.gather(1, picked)
        return parent

    def _follow_beams(self, rows: torch.Tensor, first: bool, leave: bool) -> bool:
        """Each beam's self-attention keys and values follow it (the cache's ``reorder_cache``, ``rows``: each
        beam's parent row, (sentences, beams)); after the first step, which ran one row per sentence, every beam
        gets its sentence's row. Cross-attention keys and values stay one row per sentence. With ``leave``, the
        sentences done leave the batch first, in the same copy of the cache. Says whether any sentence is left."""
        if leave:
            kept = self._leave_out_finished_sentences()
            if kept is not None and kept.shape[0] == 0:
                return False
            rows = rows if kept is None else rows[kept]
        rows = rows.flatten()
        self.cache.self_attention_cache.reorder_cache(rows // self.beams if first else rows)
        return True

    def _hits(self, token: torch.Tensor) -> torch.Tensor:
        """Which candidates hit a stopping criterion. The criteria `not_covered` admits read a sequence's
        last token and its length only, so they get a view with those, not the candidates' sequences."""
        last_tokens = token.reshape(-1, 1).expand(-1, self.length + 1)
        hits = self.stopping_criteria(last_tokens, None).view(token.shape)
        for criterion in self.sentence_limits:  # (B, 1): a sentence at its limit, every candidate of it
            hits = hits | (self.length + 1 >= criterion.limits(self.sentence_ids).to(token.device))[:, None]
        return hits

    def _update_finished_beams(self, scores, beam, token, hits) -> None:
        """transformers' merge of the candidates that ended into the finished hypotheses, each candidate's count
        of generated tokens standing for its beam indices."""
        state = self.state
        candidates = gather_beams(state["running_sequences"], beam)
        candidates[:, :, self.length] = token
        generated = torch.full_like(beam, self.length + 1 - self.prompt_length)[:, :, None]
        state["sequences"], state["beam_scores"], state["generated"], state["is_sent_finished"] = (
            self.model._update_finished_beams(  # by keyword, as `_beam_search` calls it (the GNMT penalty hooks in)
                sequences=state["sequences"],
                topk_running_sequences=candidates,
                beam_scores=state["beam_scores"],
                topk_log_probs=scores,
                beam_indices=state["generated"],
                topk_running_beam_indices=generated,
                is_early_stop_heuristic_unsatisfied=state["is_early_stop_heuristic_unsatisfied"],
                is_sent_finished=state["is_sent_finished"],
                next_token_hits_stopping_criteria=hits,
                top_num_beam_mask=self.top_beams_mask,
                num_beams=self.beams,
                cur_len=self.length,
                decoder_prompt_len=self.prompt_length,
                length_penalty=self.config.length_penalty,
                early_stopping=self.config.early_stopping,
            )
        )

    def _check_early_stop_heuristic(self) -> torch.Tensor:
        """transformers' test whether a sentence's finished hypotheses can still improve, (B, 1)."""
        state = self.state
        state["is_early_stop_heuristic_unsatisfied"] = self.model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=state["is_early_stop_heuristic_unsatisfied"],
            running_beam_scores=state["running_beam_scores"],
            beam_scores=state["beam_scores"],
            is_sent_finished=state["is_sent_finished"],
            cur_len=self.length,
            max_length=self.config.max_length,
            decoder_prompt_len=self.prompt_length,
            early_stopping=self.config.early_stopping,
            length_penalty=self.config.length_penalty,
        )
        return state["is_early_stop_heuristic_unsatisfied"]

    def _continuations(self, first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode one position and pick each sentence's best continuations. On the first step the beams of
        a sentence are copies of each other, so the decoder runs on one row per sentence."""
        running = self.state["running_sequences"]
        sequences = (running[:, :1] if first else running)[:, :, : self.length].flatten(0, 1)  # (rows, length)
        outputs = self.model(  # one encoder row per sentence, shared by its beams
            encoder_outputs=(self.encoder_hidden_states,),
            attention_mask=self.attention_mask,
            decoder_input_ids=sequences if first else sequences[:, -1:],
            use_cache=True,
            logits_to_keep=1,
            **{CACHE: self.cache},
        )
        log_probs = nn.functional.log_softmax(outputs.logits[:, -1].float(), dim=-1)  # (rows, V)
        log_probs = self.logits_processor(sequences, log_probs)
        # bfloat16 or float16 logits tie exactly at most steps: torch.topk orders the ties as transformers' does
        blocks = outputs.logits.dtype == torch.float32
        return best_continuations(log_probs, self.state["running_beam_scores"], self.keep, blocks)

    def _leave_out_finished_sentences(self) -> torch.Tensor | None:
        """Sentences whose finished hypotheses can no longer change leave the batch: the positions of those
        kept, or None when all stay. The self-attention cache is left to `_follow_beams`, which copies the
        kept rows in its reorder. One host-device synchronisation (which sentences stay)."""
        state = self.state
        improvable = state["is_early_stop_heuristic_unsatisfied"][:, 0] & (self.config.early_stopping is not True)
        done = state["is_sent_finished"].all(dim=-1) & ~improvable
        kept = (~done).nonzero().squeeze(1)
        if kept.shape[0] == done.shape[0]:
            return None
        self._store(done)
        if kept.shape[0] == 0:
            return kept
        self.state = {name: tensor[kept] for name, tensor in state.items()}
        self.sentence_ids = self.sentence_ids[kept]
        self.row_offsets = self.row_offsets[: kept.shape[0]]
        self.encoder_hidden_states = self.encoder_hidden_states[kept]
        self.attention_mask = self.attention_mask[kept] if self.attention_mask is not None else None
        self.cache.cross_attention_cache.batch_select_indices(kept)
        return kept

    def _store(self, sentences: torch.Tensor) -> None:
        """Copy these sentences' finished hypotheses to their batch positions in the result (without reading
        the mask on the host)."""
        for name, tensor in self.result.items():
            chosen = sentences.view(-1, *[1] * (tensor.dim() - 1))
            tensor[self.sentence_ids] = torch.where(chosen, self.state[name], tensor[self.sentence_ids])


def gather_beams(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``tensor[b, indices[b, k]]`` for every sentence b: the chosen beams or candidates, (B, K, ...)."""
    return torch.take_along_dim(tensor, indices.view(*indices.shape, *[1] * (tensor.dim() - 2)), dim=1)


def end_and_fill_tokens(generation_config: GenerationConfig) -> tuple[int, int]:
    """How many end-of-sequence ids the call has, and the id `_beam_search` fills unwritten positions with:
    the pad id, or the first end-of-sequence id when the pad id is unset or 0; -1 without an end id."""
    eos = generation_config.eos_token_id
    eos = [] if eos is None else torch.as_tensor(eos).view(-1).tolist()
    pad = generation_config.pad_token_id
    return len(eos), int(pad or eos[0]) if eos else -1


__all__ = [
    "BeamSearch",
    "SourceLengthCriteria",
    "VanillaTransformerGenerationMixin",
    "gnmt_length_penalty",
    "pad_after_end_of_sequence",
    "paper_generation_config",
    "penalty_formula_of",
]
