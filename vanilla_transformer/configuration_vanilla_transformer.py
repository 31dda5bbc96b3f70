"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Field names follow Marian/BART in transformers (``d_model``, ``encoder_layers``, ...) so that the
library's generic code (cache sizing, ``get_text_config``) understands the model; the fields that
only the paper's variants need (``head_dim``, ``position_embedding_type``, ``normalize_before``,
``share_encoder_decoder_embeddings``) are documented below. Presets are data, not code.
"""

# No `from __future__ import annotations`: `@strict` checks the type of a field only where its annotation is a
# type, not a string; with it, normalize_before="False" (a true string) built the pre-norm model.
import copy
import math

from huggingface_hub.dataclasses import strict
from transformers import GenerationConfig, PretrainedConfig
from transformers.activations import ACT2FN
from transformers.utils import logging

from .pipeline_vanilla_transformer import CUSTOM_PIPELINES

logger = logging.get_logger(__name__)

# Table 3 of the paper. "base" and "big" are the two published models; "tiny" is for tests and demos.
# The big model used dropout 0.3 for en-de and 0.1 for en-fr (§6.1); the preset carries 0.3.
# Every preset accepts 1024 positions (the config's default, as fairseq's): sinusoidal positions cost
# nothing to extend, and transformers' run_translation.py refuses a model with fewer positions than its
# default --max_source_length of 1024.
PRESETS: dict[str, dict] = {
    "base": dict(
        vocab_size=37000,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        dropout=0.1,
    ),
    "big": dict(
        vocab_size=37000,
        d_model=1024,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        dropout=0.3,
    ),
    "tiny": dict(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        dropout=0.1,
    ),
}

LINEAR_INITS = ("normal", "xavier_uniform")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")

# Written into every saved config.json so that a Hub folder loads with trust_remote_code=True
# in a process where this package is not installed.
AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
}


@strict
class VanillaTransformerConfig(PretrainedConfig):
    r"""Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`].

    The defaults are the paper's base model (Table 3): post-LN, 6+6 layers, d_model 512, 8 heads,
    d_ff 2048, ReLU, dropout 0.1, sinusoidal positions, embeddings scaled by sqrt(d_model), one
    matrix shared by source embedding, target embedding and pre-softmax projection (§3.4).

    Args:
        vocab_size: size of the (joint) vocabulary; the source vocabulary when not shared.
        decoder_vocab_size: size of the target vocabulary; defaults to ``vocab_size``. May differ
            only when ``share_encoder_decoder_embeddings=False``.
        d_model: width of the residual stream.
        encoder_layers, decoder_layers: N of §3.1 for each stack.
        encoder_attention_heads, decoder_attention_heads: h of §3.2.2.
        head_dim: d_k = d_v of §3.2.2. ``None`` means ``d_model // heads``; set it to vary d_k
            independently of d_model (Table 3, rows B).
        encoder_ffn_dim, decoder_ffn_dim: d_ff of §3.3.
        activation_function: the FFN's non-linearity (paper: ``"relu"``).
        dropout: P_drop of §5.4, on embeddings + positions and on every sub-layer output.
        attention_dropout: dropout on attention probabilities (not in the paper; 0 by default).
        activation_dropout: dropout after the FFN activation (not in the paper; 0 by default).
        max_position_embeddings: the longest sequence either stack accepts.
        position_embedding_type: ``"sinusoidal"`` (§3.5) or ``"learned"`` (Table 3, row E).
        scale_embedding: multiply token embeddings by sqrt(d_model) (§3.4).
        normalize_before: pre-norm ``x + Dropout(Sublayer(LN(x)))`` with a final LayerNorm after each
            stack, instead of the paper's post-norm ``LN(x + Dropout(Sublayer(x)))``.
        share_encoder_decoder_embeddings: one embedding matrix for source and target (needs a
            joint vocabulary).
        tie_word_embeddings: the pre-softmax projection reuses the target embedding matrix.
        init_std: standard deviation of the token (and learned position) embeddings at
            initialisation; ``None`` means ``d_model ** -0.5``, so that the scaled embedding has unit
            variance per component.
        linear_init: how every linear weight starts (the paper gives no initialisation):
            ``"normal"``, N(0, ``linear_init_std``), or ``"xavier_uniform"``, fairseq's and
            tensor2tensor's choice. Biases start at zero either way.
        linear_init_std: the std of ``"normal"``. ``None`` means sqrt(2 / (5 d_model)), the "small
            init" of Nguyen & Salazar (2019, "Transformers without Tears"); 0.02 is BART's and
            MarianMT's. Measured on Multi30k (d_model 256) and on a d_model 32 copy task, small
            init learns faster per update than Xavier-uniform (docs/benchmarks/multi30k.md;
            `benchmarks/learning_curve_probe.py`). An untied pre-softmax projection is a linear
            too and starts the same way.
        layer_norm_eps: epsilon of every LayerNorm.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id: special ids; they match
            the order in which `train_tokenizer` creates ``<pad> <unk> <s> </s>``.
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]  # the cache output: its name before and from 5.24
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    decoder_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    head_dim: int | None = None
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    max_position_embeddings: int = 1024
    position_embedding_type: str = "sinusoidal"
    scale_embedding: bool = True
    normalize_before: bool = False
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    init_std: float | int | None = None
    linear_init: str = "normal"
    linear_init_std: float | int | None = None
    layer_norm_eps: float | int = 1e-5
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | None = 3
    decoder_start_token_id: int | None = 2
    use_cache: bool = True
    is_encoder_decoder: bool = True
    is_decoder: bool = False

    def __post_init__(self, **kwargs):
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        # transformers drops generation settings given to a model config, without a word
        defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)  # private: see private_api.py
        if dropped := sorted(set(kwargs) & set(defaults())):
            logger.warning(
                f"{', '.join(f'{name}={kwargs[name]!r}' for name in dropped)}: generation settings belong in "
                "model.generation_config (a GenerationConfig, saved as generation_config.json), not in the model's "
                "config; left out of it."
            )
        kwargs.setdefault("auto_map", copy.deepcopy(AUTO_MAP))
        # Like auto_map: pipeline("translation", model=folder, trust_remote_code=True) finds the pipeline.
        kwargs.setdefault("custom_pipelines", copy.deepcopy(CUSTOM_PIPELINES))
        super().__post_init__(**kwargs)

    def __setattr__(self, name, value):
        # One joint vocabulary (§3.4): a new vocab_size given after construction (from_pretrained(...,
        # vocab_size=N), config.vocab_size = N) is the target side's too, as at construction.
        if (
            name == "vocab_size"
            and getattr(self, "share_encoder_decoder_embeddings", False)
            and "decoder_vocab_size" in self.__dict__
            and self.decoder_vocab_size == self.__dict__.get("vocab_size")
        ):
            super().__setattr__("decoder_vocab_size", value)
        super().__setattr__(name, value)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "VanillaTransformerConfig":
        """`PretrainedConfig.from_dict`, refusing the config of another model (transformers only warns), and
        checking the values given beside the file (``from_pretrained(folder, dropout=...)``), which transformers
        sets after construction, unchecked."""
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(
                f"This config.json describes a {model_type!r} model, not a {cls.model_type!r} one: the folder or "
                f"repo holds another model's checkpoint. Point to a vanilla-transformer checkpoint, or load this one "
                f"with the Auto classes (e.g. AutoModel.from_pretrained), which pick the class its model_type names."
            )
        loaded = super().from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()  # a tuple with return_unused_kwargs
        return loaded

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerConfig":
        """A config from the paper's Table 3 (``"base"``, ``"big"``) or ``"tiny"``, with overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    # Called by `@strict` validation (at construction and before saving): one place for every check.
    def validate_vanilla_transformer(self):
        """Reject configurations the model cannot build or would build wrongly."""
        sizes = [
            "vocab_size",
            "decoder_vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ]
        for name in sizes + (["head_dim"] if self.head_dim is not None else []):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.max_position_embeddings < 2:
            raise ValueError(
                f"max_position_embeddings must be at least 2 (the decoder's start token and one more), got "
                f"{self.max_position_embeddings}."
            )
        if self.is_encoder_decoder is not True or self.is_decoder is not False:
            raise ValueError(
                f"is_encoder_decoder={self.is_encoder_decoder!r}, is_decoder={self.is_decoder!r}: this model is "
                "an encoder-decoder (True, False); leave both unset."
            )
        if self.head_dim is None:
            for name in ("encoder_attention_heads", "decoder_attention_heads"):
                heads = getattr(self, name)
                if self.d_model % heads:
                    raise ValueError(
                        f"d_model={self.d_model} is not divisible by {name}={heads}: pick a head count "
                        f"that divides d_model, or set head_dim explicitly (Table 3, rows B)."
                    )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}.")
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"Unknown activation_function {self.activation_function!r}; the paper uses 'relu', "
                f"others available: {', '.join(sorted(ACT2FN))}."
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"Unknown position_embedding_type {self.position_embedding_type!r}; choose one of "
                f"{POSITION_EMBEDDING_TYPES}."
            )
        if self.position_embedding_type == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"Sinusoidal positions (§3.5) pair sin and cos, so d_model must be even, got {self.d_model}."
            )
        if not 0 < self.layer_norm_eps < math.inf:  # inf: every LayerNorm's output its bias alone
            raise ValueError(f"layer_norm_eps must be positive and finite, got {self.layer_norm_eps!r}.")
        if self.linear_init not in LINEAR_INITS:
            raise ValueError(f"Unknown linear_init {self.linear_init!r}; choose one of {LINEAR_INITS}.")
        if self.linear_init == "xavier_uniform" and self.linear_init_std is not None:
            raise ValueError(
                f"linear_init_std={self.linear_init_std!r} has no effect with linear_init='xavier_uniform', whose "
                "scale follows from each layer's shape. Drop linear_init_std, or use linear_init='normal'."
            )
        for name in ("init_std", "linear_init_std"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:  # inf: weights of inf and nan
                raise ValueError(
                    f"{name} must be positive and finite, or None (see the docstring for what None means), got "
                    f"{value!r}."
                )
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"share_encoder_decoder_embeddings=True needs one joint vocabulary, but vocab_size="
                f"{self.vocab_size} and decoder_vocab_size={self.decoder_vocab_size}. Use a joint "
                f"vocabulary, or set share_encoder_decoder_embeddings=False."
            )
        self._validate_special_token_ids()

    def _validate_special_token_ids(self):
        # pad and eos end or fill both sides; bos and decoder start are target-side only.
        vocabularies = {
            "pad_token_id": ("source", "target"),
            "eos_token_id": ("source", "target"),
            "bos_token_id": ("target",),
            "decoder_start_token_id": ("target",),
        }
        sizes = {"source": self.vocab_size, "target": self.decoder_vocab_size}
        for name, sides in vocabularies.items():
            value = getattr(self, name)
            if value is None:
                continue
            for side in sides:
                if not 0 <= value < sizes[side]:
                    raise ValueError(
                        f"{name}={value} is outside the {side} vocabulary of size {sizes[side]}: use the ids "
                        f"of the tokenizer the model is trained with."
                    )
        if self.decoder_start_token_id is None:
            raise ValueError("decoder_start_token_id must be set: the decoder needs a first input token.")
        if self.pad_token_id is None:
            raise ValueError(
                "pad_token_id must be set: batches are padded with it, and labels shifted into decoder inputs "
                "with it; use the tokenizer's pad id."
            )


__all__ = ["VanillaTransformerConfig", "PRESETS"]
