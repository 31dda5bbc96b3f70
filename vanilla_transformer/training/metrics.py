"""Translation scores, offline, through `evaluate`: the one scorer of the package.

`load_translation_metric()` is ``evaluate.load`` on the metric module shipped with the package
(`bleu_chrf.py`: sacreBLEU + chrF with signatures); `score` calls it on two lists of strings;
`TranslationMetrics` is a ``compute_metrics`` for `Seq2SeqTrainer` that decodes the predictions
and reports BLEU, chrF, the mean generation length (the non-pad tokens after the decoder's start
token, ``</s>`` included, as transformers' example scripts count MarianMT's) and the share of
hypotheses cut off by the length limit. train.py, translate.py, the benchmarks and the README's
own-script example all score through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..command_line import require_extra

METRIC_PATH = Path(__file__).with_name("bleu_chrf.py")


def load_translation_metric():
    """The sacreBLEU + chrF metric as an `evaluate.EvaluationModule`, loaded from this package (no network)."""
    require_extra("train", ("evaluate",), "Scoring (sacreBLEU and chrF through evaluate)")
    import evaluate

    return evaluate.load(str(METRIC_PATH))


def check_sacrebleu_tokenize(name: str, flag: str) -> None:
    """Refuse an unknown sacreBLEU tokenizer (or one whose package is missing) before any decoding."""
    import sacrebleu

    try:
        sacrebleu.metrics.BLEU(tokenize=name)
    except (KeyError, ValueError, ImportError, RuntimeError) as error:
        names = ", ".join(sacrebleu.metrics.BLEU.TOKENIZERS)
        problem = "does not exist" if isinstance(error, KeyError) else f"cannot be used here ({error})"
        raise ValueError(f"{flag} {name!r} {problem}; sacreBLEU's tokenizers are {names}.") from None


def score(hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], **options) -> dict:
    """sacreBLEU and chrF of ``hypotheses`` against ``references`` (one or a list per hypothesis), with
    signatures; ``options`` go to the metric (``tokenize``, ``compound_split_bleu``, ``language``, ...)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: they must align.")
    options = {key: value for key, value in options.items() if value is not None}
    return load_translation_metric().compute(predictions=list(hypotheses), references=list(references), **options)


class TranslationMetrics:
    """``compute_metrics`` for the Trainer: sacreBLEU, chrF, ``gen_len`` of decoded predictions and
    ``unfinished_percent``, the share that reached the length limit without ``</s>`` (an undertrained
    model looping; MarianMT's default ``forced_eos_token_id`` would hide such loops).

    Keeps the signatures of the last evaluation (``self.signatures``) for the model card.

    ``references``: the evaluation set's target sentences as written, in its order. The hypotheses are scored
    against them, as `score` scores a test set, where each still tokenizes to its row's labels; otherwise
    (pairs dropped, another evaluation set) against the labels decoded, the text as the tokenizer normalises
    it (NFKC: "…" as "...", a no-break space as a space), which sacreBLEU scores slightly differently.
    """

    def __init__(self, tokenizer, references: Sequence[str] | None = None, **options):
        self.tokenizer, self.options = tokenizer, options
        self.references = None if references is None else list(references)
        self._reference_ids = None  # the references tokenized, once for every evaluation
        self.signatures: dict[str, str] = {}

    def _as_written(self, label_ids: np.ndarray) -> list[str] | None:
        """`references` where they are the text of these labels (each tokenizes to its row), else None."""
        if self.references is None or len(self.references) != len(label_ids):
            return None
        if self._reference_ids is None:
            self._reference_ids = self.tokenizer(text_target=self.references, truncation=False)["input_ids"]
        rows = [[int(token) for token in row if token >= 0] for row in label_ids]
        return self.references if self._reference_ids == rows else None

    def __call__(self, prediction) -> dict:
        if isinstance(prediction.predictions, tuple) or prediction.predictions.dtype.kind == "f":
            raise ValueError(
                "TranslationMetrics scores translations, but the Trainer passed logits: evaluate with "
                "predict_with_generate=True, or leave compute_metrics out to report the loss only."
            )
        pad = self.tokenizer.pad_token_id
        predictions = np.where(prediction.predictions < 0, pad, prediction.predictions)
        labels = np.where(prediction.label_ids < 0, pad, prediction.label_ids)
        hypotheses = self.tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = self._as_written(prediction.label_ids) or self.tokenizer.batch_decode(
            labels, skip_special_tokens=True
        )
        result = score(hypotheses, references, **self.options)
        self.signatures = {kind: result.pop(f"{kind}_signature") for kind in ("bleu", "chrf")}
        # Generated tokens per sentence, </s> included, as run_translation.py counts them (every non-pad token),
        # but after the decoder's start token: ours is <s>, MarianMT's is <pad>, which that count leaves out.
        result["gen_len"] = float(np.mean(np.count_nonzero(predictions[:, 1:] != pad, axis=1)))
        # Hypotheses without </s> after the decoder's start token: cut off by the length limit (loops).
        ended = (predictions[:, 1:] == self.tokenizer.eos_token_id).any(axis=1)
        result["unfinished_percent"] = 100 * float(np.mean(~ended))
        return result
