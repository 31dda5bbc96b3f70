"""A generated translation task: English number words to German number words.

"three thousand four hundred twenty-one" -> "dreitausendvierhunderteinundzwanzig". Solving it takes
what translation takes: reordering (German says the units before the tens: "einundzwanzig"),
agreement-like rules ("eins" alone but "ein" in compounds), irregular forms ("elf", "zwölf",
"dreißig", "sechzehn", "siebzig") and word segmentation (German writes the number as one word).
No download: the data is made here, deterministically from a seed.
"""

from __future__ import annotations

import random

ENGLISH_UNITS = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
ENGLISH_TEENS = [
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
ENGLISH_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

GERMAN_UNITS = ["", "ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
GERMAN_TEENS = [
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
]
GERMAN_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]

MAX_NUMBER = 999_999


def english(number: int) -> str:
    """American English number words without "and": 121 -> "one hundred twenty-one"."""
    _check(number)
    if number == 0:
        return "zero"
    thousands, rest = divmod(number, 1000)
    words = [f"{_english_below_1000(thousands)} thousand"] if thousands else []
    if rest:
        words.append(_english_below_1000(rest))
    return " ".join(words)


def _english_below_1000(number: int) -> str:
    hundreds, rest = divmod(number, 100)
    words = [f"{ENGLISH_UNITS[hundreds]} hundred"] if hundreds else []
    if 10 <= rest < 20:
        words.append(ENGLISH_TEENS[rest - 10])
    elif rest:
        tens, units = divmod(rest, 10)
        words.append("-".join(w for w in (ENGLISH_TENS[tens], ENGLISH_UNITS[units]) if w))
    return " ".join(words)


def german(number: int) -> str:
    """German number words, one word: 121 -> "einhunderteinundzwanzig", 1 -> "eins"."""
    _check(number)
    if number == 0:
        return "null"
    thousands, rest = divmod(number, 1000)
    word = f"{_german_below_1000(thousands)}tausend" if thousands else ""
    if rest:
        word += _german_below_1000(rest)
    # a final unit one is "eins": "eins", "hunderteins", but "einundzwanzig", "eintausend"
    return word + "s" if number % 100 == 1 else word


def _german_below_1000(number: int) -> str:
    hundreds, rest = divmod(number, 100)
    word = f"{GERMAN_UNITS[hundreds]}hundert" if hundreds else ""
    if 10 <= rest < 20:
        return word + GERMAN_TEENS[rest - 10]
    tens, units = divmod(rest, 10)
    if tens:  # units before tens: "einundzwanzig"
        return word + (f"{GERMAN_UNITS[units]}und" if units else "") + GERMAN_TENS[tens]
    return word + GERMAN_UNITS[units]


def _check(number: int) -> None:
    if not isinstance(number, int) or not 0 <= number <= MAX_NUMBER:
        raise ValueError(f"Number words are defined for integers 0..{MAX_NUMBER}, got {number!r}.")


def make_splits(
    train_size: int, test_size: int, max_number: int = 9999, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Disjoint train and test pairs (English, German) of distinct numbers drawn from 1..max_number."""
    if not isinstance(max_number, int) or not 1 <= max_number <= MAX_NUMBER:  # before a sample names a number
        raise ValueError(f"max_number must be a whole number in 1..{MAX_NUMBER}, got {max_number!r}.")
    if train_size + test_size > max_number:
        raise ValueError(
            f"Asked for {train_size + test_size} distinct numbers but only {max_number} exist up to "
            f"max_number={max_number}: lower the sizes or raise max_number."
        )
    numbers = random.Random(seed).sample(range(1, max_number + 1), train_size + test_size)
    pairs = [(english(n), german(n)) for n in numbers]
    return pairs[:train_size], pairs[train_size:]
