"""How many processes `make test` runs the suite in (pytest-xdist): the cores this process may use, as its CPU
affinity and its cgroup's CPU quota (a container's limit, which the affinity does not show) allow, at most 4."""

from __future__ import annotations

import math
import os
from pathlib import Path

MOST = 4  # more saves little: the suite's longest test files take minutes each


def usable_cores(quota_file: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = quota_file.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file (macOS, cgroup v1): the affinity alone
        pass
    return cores


if __name__ == "__main__":
    print(min(MOST, usable_cores()))
