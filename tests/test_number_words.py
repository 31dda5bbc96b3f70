"""The generated demo task against number words written out by hand."""

import pytest

from vanilla_transformer.training.number_words import english, german, make_splits

# Written by hand from German and American English usage, not produced by the code under test.
KNOWN = {
    1: ("one", "eins"),
    11: ("eleven", "elf"),
    16: ("sixteen", "sechzehn"),
    17: ("seventeen", "siebzehn"),
    21: ("twenty-one", "einundzwanzig"),
    30: ("thirty", "dreißig"),
    67: ("sixty-seven", "siebenundsechzig"),
    100: ("one hundred", "einhundert"),
    101: ("one hundred one", "einhunderteins"),
    212: ("two hundred twelve", "zweihundertzwölf"),
    1001: ("one thousand one", "eintausendeins"),
    3421: ("three thousand four hundred twenty-one", "dreitausendvierhunderteinundzwanzig"),
    21000: ("twenty-one thousand", "einundzwanzigtausend"),
    999999: (
        "nine hundred ninety-nine thousand nine hundred ninety-nine",
        "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
    ),
}


@pytest.mark.parametrize("number", KNOWN)
def test_number_words_match_hand_written_translations(number):
    assert (english(number), german(number)) == KNOWN[number]


def test_splits_are_disjoint_deterministic_and_sized():
    train, test = make_splits(500, 50, max_number=999, seed=3)
    assert len(train) == 500 and len(test) == 50
    assert not {s for s, _ in train} & {s for s, _ in test}
    assert make_splits(500, 50, max_number=999, seed=3) == (train, test)


def test_out_of_range_numbers_and_oversized_splits_are_errors():
    with pytest.raises(ValueError, match="0..999999"):
        german(1_000_000)
    with pytest.raises(ValueError, match="only 99 exist"):
        make_splits(90, 10, max_number=99)
    with pytest.raises(ValueError, match=r"max_number must be a whole number in 1..999999, got 2000000"):
        make_splits(10, 10, max_number=2_000_000)  # the error named a random number drawn, not the argument
