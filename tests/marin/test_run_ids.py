"""A run id changes exactly when what the run computes changes (docs/architecture.md §3)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from checkout import copy_checkout

from marin_ablate.ablations.studies import get_study
from marin_ablate.marin.config import SPEC_VERSION, RunSpec, non_default, to_dict
from marin_ablate.marin.switches import RECIPE_FACTOR_SPECS

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("spec_identity.json")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_every_default_and_identity_level_is_pinned_for_the_spec_version():
    # The id leaves defaults and identity levels out of its hash: changing one changes what runs compute
    # under the same id. Bump marin.config.SPEC_VERSION and rewrite tests/marin/spec_identity.json together.
    pin = json.loads(PINNED.read_text())
    now = to_dict(RunSpec())
    now.pop("recipe")
    levels = {s.name: s.identity_level for s in RECIPE_FACTOR_SPECS}
    assert pin["spec_version"] == SPEC_VERSION, "SPEC_VERSION changed: rewrite tests/marin/spec_identity.json"
    was, cur = _flat(pin["defaults"]), _flat(now)
    changed = {k: (v, cur.get(k, "<removed>")) for k, v in was.items() if k not in cur or cur[k] != v}
    assert not changed, f"defaults changed without a SPEC_VERSION bump (pinned, now): {changed}"
    moved = {k: (v, levels.get(k, "<removed>")) for k, v in pin["identity_levels"].items() if levels.get(k) != v}
    assert not moved, f"recipe identity levels changed without a SPEC_VERSION bump (pinned, now): {moved}"


_IDS = """
import dataclasses, json, sys
from marin_ablate.ablations.studies import get_study
import marin_ablate.marin.switches as switches
assert switches.__file__.startswith(sys.argv[2]), switches.__file__  # the copy, not the checkout
runs = [s for s, _ in get_study("smoke").runs()]
extra = json.loads(sys.argv[1])
print(json.dumps({"plain": [s.run_id for s in runs],
                  "set": [dataclasses.replace(s, recipe=dataclasses.replace(s.recipe, **extra)).run_id for s in runs]}))
"""


def _ids_with_row(tmp_path: Path, row: str, extra: dict) -> dict:
    """Run ids of the smoke study planned by a copy of the package whose factor table has one more row."""
    copy_checkout(tmp_path)
    table = tmp_path / "marin" / "switches.py"
    src = table.read_text()
    anchor = "RECIPE_FACTOR_SPECS: tuple[FactorSpec, ...] = ("
    assert anchor in src
    table.write_text(src.replace(anchor, anchor + "\n    " + row + ","))
    out = subprocess.run([sys.executable, "-c", _IDS, json.dumps(extra), str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("before", [None, "on"])
def test_a_new_recipe_factor_gives_a_new_id_to_every_run_it_changes_and_to_no_other(tmp_path, before):
    runs = [s for s, _ in get_study("smoke").runs()]
    old = [s.run_id for s in runs]
    # a new switch whose default (the recipe level "on") runs a new branch, "off" the code as it was;
    # before="on": a hard-wired component made switchable, so "on" is what every run computed
    row = f'FactorSpec("mtp", "on", "off", before={before!r}, doc="multi-token prediction head")'
    new = _ids_with_row(tmp_path / "pkg", row, {"mtp": "off"})
    assert len(set(new["plain"])) == len(old) and len(set(new["set"])) == len(old)
    if before is None:  # every run now trains the new branch; set to "off" they compute what they did
        assert not set(new["plain"]) & set(old)
        assert new["set"] == old
    else:
        assert new["plain"] == old
        assert not set(new["set"]) & set(old)


def test_adding_a_defaulted_field_keeps_existing_run_ids():
    spec = get_study("smoke").runs()[5][0]
    before = spec.run_id
    # TrainConfig grows a field whose default reproduces the old behaviour
    New = dataclasses.make_dataclass("TrainConfig", [("new_knob", float, dataclasses.field(default=0.0))],
                                     bases=(type(spec.train),), frozen=True)
    fields = dataclasses.asdict(spec.train) | {"context_stages": ()}
    assert dataclasses.replace(spec, train=New(**fields)).run_id == before
    assert dataclasses.replace(spec, train=New(**fields, new_knob=1.0)).run_id != before
    assert non_default(RunSpec()) == {}


def test_a_spec_version_bump_re_identifies_every_run(monkeypatch):
    import marin_ablate.marin.config as config

    spec = get_study("smoke").runs()[5][0]
    before = spec.run_id
    monkeypatch.setattr(config, "SPEC_VERSION", SPEC_VERSION + 1)
    assert dataclasses.replace(spec).run_id != before  # a fresh spec: run_id is computed once per object


def test_the_recipe_enters_the_id_by_its_switches_away_from_their_identity_level():
    base = RunSpec()
    ident = json.loads(base.identity_json())
    assert set(ident["recipe"]) == {s.name for s in RECIPE_FACTOR_SPECS}  # all-on: every switch differs
    peer = dataclasses.replace(base, recipe=type(base.recipe).baseline())
    assert "recipe" not in json.loads(peer.identity_json())
    assert peer.run_id != base.run_id


def test_planning_computes_each_run_id_once(monkeypatch, capsys):
    from marin_ablate.cli.main import main

    calls = []
    ident = RunSpec.identity_json
    monkeypatch.setattr(RunSpec, "identity_json", lambda self: calls.append(1) or ident(self))
    assert main(["plan", "smoke"]) == 0  # describe, the run list and the epoch check share one spec each
    n = len(calls)
    smoke = get_study("smoke")
    # the design's 256 runs and, priced before it, the reference ladder's (the baseline arm on its rungs x seeds)
    ladder = len(smoke.reference_rungs) * len(smoke.reference_seeds)
    assert n == len(smoke.runs()) + ladder == 256 + 21
