"""benchmarks/scale.py: a deterministic corpus, and one small measured run of train.py to its first update."""

import gzip

import pytest

from helpers import load_script

scale = load_script("benchmarks/scale.py")


def test_the_corpus_is_deterministic_aligned_and_wmt_sized(tmp_path):
    first = scale.write_corpus(tmp_path / "a", 2000, seed=3, chunk=700)
    again = scale.write_corpus(tmp_path / "b", 2000, seed=3, chunk=700)
    lines = [gzip.open(path, "rt").read().splitlines() for path in first]
    assert lines == [gzip.open(path, "rt").read().splitlines() for path in again]
    assert len(lines[0]) == len(lines[1]) == 2000 and all(lines[0]) and all(lines[1])
    words = sum(len(line.split()) for line in lines[0]) / 2000
    assert 20 < words < 32  # about WMT14's 26 words a side
    assert scale.write_corpus(tmp_path / "a", 2000, seed=3) == first  # reused, not rewritten


@pytest.mark.slow  # a benchmark's own run (benchmarks/scale.py); its corpus is checked in the default suite
def test_a_small_run_reports_time_memory_and_cores(tmp_path):
    source, target = scale.write_corpus(tmp_path / "corpus", 300)
    result = scale.run_once(1, source, target, tmp_path, tmp_path / "cache")
    assert 0 < result["seconds_to_first_update"] <= result["seconds_total"]
    [peak] = result["peak_memory_mib_per_process"]
    assert 100 < peak < 20_000 and result["cores_busy"] > 0
