"""Data-mixture phases: the typed value of `DataConfig.mixture` and its validation, torch-free (the
loader's side is marin/data/mixture.py; docs/fidelity.md "data mixture")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from marin_ablate.marin.fields import check, is_num


@dataclass(frozen=True)
class MixturePhase:
    """From `start_frac` of the steps on, a step's sequences come from the corpus's domains in
    proportion to `weights` ((domain, weight) pairs, sorted by domain; marin/data/mixture.py)."""

    start_frac: float
    weights: tuple[tuple[str, float], ...]


def _mixture_phase(p: Any, i: int) -> MixturePhase:
    """One phase from a MixturePhase, a (start_frac, {domain: weight}) pair, or the `--data.mixture=` string
    form "FRAC:DOMAIN=W+DOMAIN=W"; weights sorted by domain name so equal mixtures are equal specs."""
    where = f"phase {i}"
    if isinstance(p, str):
        text = p
        frac, sep, body = p.partition(":")
        pairs = [w.partition("=") for w in body.split("+") if w]
        try:
            p = (float(frac), {d.strip(): float(w) for d, eq, w in pairs if eq} if sep and all(eq for _, eq, _ in pairs)
                 else None)
        except ValueError:
            p = (None, None)
        if p[1] is None:
            raise ValueError(f"DataConfig.mixture: {where} {text!r} does not parse; allowed values: "
                             "FRAC:DOMAIN=WEIGHT+DOMAIN=WEIGHT[,FRAC:...] (e.g. 0:prose=1+code=1,0.8:code=1)")
    if isinstance(p, MixturePhase):
        frac, weights = p.start_frac, dict(p.weights)
    elif isinstance(p, Mapping):
        frac, weights = p.get("start_frac"), p.get("weights")
        weights = dict(weights) if isinstance(weights, (Mapping, list, tuple)) else weights
    elif isinstance(p, (tuple, list)) and len(p) == 2:
        frac, weights = p[0], dict(p[1]) if isinstance(p[1], (Mapping, list, tuple)) else p[1]
    else:
        raise ValueError(f"DataConfig.mixture: {where} is {p!r}; allowed values: (start_frac, {{domain: weight}})")
    check(isinstance(weights, dict) and len(weights) > 0, "DataConfig", "mixture",
          f"{where} weights {weights!r}; allowed values: a non-empty {{domain: weight}} mapping")
    for d, w in weights.items():
        check(isinstance(d, str) and d != "", "DataConfig", "mixture",
              f"{where} domain {d!r}; allowed values: a domain name of the corpus")
        check(is_num(w) and w >= 0, "DataConfig", "mixture",
              f"{where} weight of {d!r} is {w!r}; allowed values: a finite number >= 0")
    check(sum(weights.values()) > 0, "DataConfig", "mixture",
          f"{where} weights sum to 0; allowed values: weights >= 0 with a positive sum")
    check(is_num(frac), "DataConfig", "mixture", f"{where} start_frac={frac!r}; allowed values: a number in [0, 1)")
    return MixturePhase(float(frac), tuple(sorted((d, float(w)) for d, w in weights.items())))


def check_mixture(phases: Any) -> tuple[MixturePhase, ...]:
    """Normalise and validate DataConfig.mixture: start fractions 0 first, strictly increasing, < 1."""
    if isinstance(phases, str):
        phases = tuple(x for x in phases.split(",") if x)
    out = tuple(_mixture_phase(p, i) for i, p in enumerate(phases))
    fr = [p.start_frac for p in out]
    check(not out or fr[0] == 0, "DataConfig", "mixture",
          f"the first phase starts at start_frac={fr[0] if fr else None!r}; "
          "allowed values: 0 (every step needs a phase)")
    check(all(a < b for a, b in zip(fr, fr[1:], strict=False)) and all(0 <= f < 1 for f in fr),
          "DataConfig", "mixture",
          f"phase start fractions {fr}; allowed values: strictly increasing numbers in [0, 1), the first 0")
    return out
