"""The mutation table of tests/rate_mutations.py stays in step with the code: every substitution still matches its
file exactly once, every named test exists, and every rate of benchmarks/rates.py that the suite keeps a small
version of has a mutation its test must catch. The slow half (running them) is `python tests/rate_mutations.py`."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import fidelity_mutations as fm  # noqa: E402
import rate_mutations as rm  # noqa: E402
from benchmod import bench  # noqa: E402


def test_every_rate_mutation_matches_its_file_once_and_names_a_test_that_exists():
    for m, tests in rm.MUTATIONS:
        for rel, old, new in m.edits:
            n = (ROOT / rel).read_text().count(old)
            assert n == 1 and old != new, f"{m.row} ({m.what}): {rel} holds {n} copies of {old!r}"
        for t in tests:
            f, name = t.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / fm.find_test_file(f)).read_text(), re.M), f"{t} does not exist"


def test_every_benchmarked_rate_names_its_small_test_and_has_a_mutation():
    rates = bench("rates")
    mutated = {m.row for m, _ in rm.MUTATIONS}
    for name, rate in rates.RATES.items():
        assert name.split("_")[0] in {r.split("_")[0] for r in mutated}, f"rate {name} has no mutation"
        f, test = rate.test.split("::")
        assert re.search(rf"^def {test}\(", (ROOT / fm.find_test_file(f)).read_text(), re.M), rate.test
