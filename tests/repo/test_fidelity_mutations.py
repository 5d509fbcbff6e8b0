"""The mutation table of docs/fidelity.md (tests/fidelity_mutations.py) stays in step with the code and
the document: every row has a mutation, every substitution still matches its file exactly once, every
named test exists. The slow half (running each mutation) is `python tests/fidelity_mutations.py`."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import fidelity_mutations as fm  # noqa: E402


def test_every_fidelity_row_has_a_mutation_and_names_a_test_that_exists():
    rows = fm.doc_rows()
    assert len(rows) >= 36
    assert set(rows) == {m.row for m in fm.MUTATIONS}, "a docs/fidelity.md row without a mutation (or the reverse)"
    for row, tests in rows.items():
        assert tests, f"row {row!r} names no test (FILE.py::test_NAME, a file under tests/)"
        for t in tests:
            f, name = t.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / fm.find_test_file(f)).read_text(), re.M), \
                f"{row}: {t} does not exist"


def test_every_mutation_matches_its_file_exactly_once():
    for m in fm.MUTATIONS:
        for rel, old, new in m.edits:
            n = (ROOT / rel).read_text().count(old)
            assert n == 1, f"{m.row} ({m.what}): {rel} holds {n} copies of {old!r}"
            assert old != new
