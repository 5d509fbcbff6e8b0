"""The entry point's own flags: `--version` and the `studies` listing (no torch, plugins' studies included)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from marin_ablate.ablations.studies import STUDIES, get_study
from marin_ablate.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_prints_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"marin-ablate {version('marin-ablate')}"


def test_studies_lists_every_registered_study_with_its_one_line_description(capsys):
    assert main(["studies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(STUDIES)
    assert all(r["description"] == get_study(r["name"]).description and "\n" not in r["description"] for r in rows)
    assert main(["studies"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == len(STUDIES) and table[0].split()[0] == "smoke"


def test_listing_the_studies_loads_no_torch():
    code = "import sys\nfrom marin_ablate.cli.main import main\nmain(['studies'])\nprint('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
