"""A data-mixture schedule: which corpus domain each sequence of a training step comes from.

Marin's hero scaling ladder trains on two phases of domain weights, the second from 80% of the steps
on (experiments/grug/moe/launch_datakit_moe_mix.py `_phase_1_start_step`, `_datakit_data_config`;
docs/fidelity.md "data mixture"). Here phase p covers steps [floor(f_p·T), floor(f_{p+1}·T)) of T
steps. Within a phase, after N sequences domain d has had s_d(N) of them: the Sainte-Laguë (Webster)
apportionment of N seats to the phase's weights, so every prefix of the phase holds the proportions
to within about one sequence per domain, and the method is house-monotone, so a step's count
s_d(N+G) − s_d(N) is never negative. A step's G sequences are those counts laid out in an order
shuffled by (seed, step); rank r of W takes slots r·G/W … (r+1)·G/W − 1. Everything is a function of
(phases, domains, T, G, seed, step) alone: a resumed run, or one on another number of ranks, reads
the same sequences, and the ranks read disjoint parts of one global batch. A context stage
(another sequence length, the same tokens per step) counts its own sequences, so at a stage change a
domain's stream resumes within a few sequences of where the previous stage left it.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from marin_ablate.marin.data.corpus import EMBEDDED_SOURCES

_MASK64 = (1 << 64) - 1


def webster(n: int, w_D: np.ndarray) -> np.ndarray:
    """Sainte-Laguë / Webster apportionment of `n` seats to weights `w_D` (>= 0, positive sum): seats
    go one at a time to the largest w_d / (s_d + 1/2), ties to the first domain. Computed directly by
    rounding the quotas and moving the seats the sequential rule would award last or next."""
    w_D = np.asarray(w_D, np.float64) / float(np.sum(w_D))
    s_D = np.where(w_D > 0, np.floor(n * w_D + 0.5), 0).astype(np.int64)
    pos = w_D > 0
    while s_D.sum() > n:  # take back the seat with the smallest priority (the last awarded; ties: last domain)
        pri = np.where(pos & (s_D > 0), w_D / np.maximum(s_D - 0.5, 1e-300), np.inf)
        s_D[len(pri) - 1 - int(np.argmin(pri[::-1]))] -= 1
    while s_D.sum() < n:  # award the next seat (ties: first domain)
        pri = np.where(pos, w_D / (s_D + 0.5), -np.inf)
        s_D[int(np.argmax(pri))] += 1
    return s_D


def splitmix64(x_N: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele et al. 2014) on uint64: a fixed, numpy-version-independent mix."""
    with np.errstate(over="ignore"):
        z = x_N + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def slot_order(seed: int, step: int, n: int) -> np.ndarray:
    """The order of a step's n slots: argsort of SplitMix64(sha256(seed:step) + j)."""
    base = int(hashlib.sha256(f"mixture:{seed}:{step}".encode()).hexdigest()[:16], 16)
    keys = splitmix64((np.arange(n, dtype=np.uint64) + np.uint64(base)) & np.uint64(_MASK64))
    return np.argsort(keys, kind="stable")


def phase_start(frac: float, total_steps: int, global_batch: int, block: int = 0) -> int:
    """A later phase's first step: floor(frac x steps); with a mixture block of `block` sequences,
    rounded down to a multiple of block/gcd(block, batch) steps and at least one such multiple (Marin:
    launch_datakit_moe_mix.py `_phase_1_start_step`)."""
    step = math.floor(frac * total_steps)
    if not block:
        return step
    m = block // math.gcd(block, global_batch)
    return max(m, (max(1, step) // m) * m)


class MixturePlan:
    """The per-step domain layout of a mixture (`DataConfig.mixture` phases) over `domains`."""

    def __init__(self, phases: Sequence, domains: Sequence[str], total_steps: int, global_batch: int, seed: int,
                 where: str = "corpus", block: int = 0):
        self.domains, self.G, self.seed, self.T = list(domains), int(global_batch), int(seed), int(total_steps)
        if self.T < 1:
            raise ValueError(f"TrainConfig.steps={total_steps!r}: a mixture needs the run's steps >= 1")
        index = {d: i for i, d in enumerate(self.domains)}
        self.w_PD = np.zeros((len(phases), len(self.domains)))
        for p, ph in enumerate(phases):
            for d, w in ph.weights:
                if d not in index:
                    raise ValueError(f"DataConfig.mixture: phase {p} names domain {d!r}, which {where} does not have; "
                                     f"allowed values: {', '.join(map(repr, self.domains)) or '(no domains)'}")
                self.w_PD[p, index[d]] = w
        self.start_P = np.array([phase_start(ph.start_frac, self.T, self.G, block) if p else 0
                                 for p, ph in enumerate(phases)], np.int64)
        # sequences of each domain read before each phase starts
        self.base_PD = np.zeros_like(self.w_PD, dtype=np.int64)
        for p in range(1, len(phases)):
            n = int(self.start_P[p] - self.start_P[p - 1]) * self.G
            self.base_PD[p] = self.base_PD[p - 1] + webster(n, self.w_PD[p - 1])

    def phase_of(self, step: int) -> int:
        return int(np.searchsorted(self.start_P, step, side="right")) - 1

    def counts(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(first_D, count_D): each domain's first sequence index and its number of sequences at `step`."""
        p = self.phase_of(step)
        n = int(step - self.start_P[p]) * self.G
        before = webster(n, self.w_PD[p])
        return self.base_PD[p] + before, webster(n + self.G, self.w_PD[p]) - before

    def slots(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(domain_G, index_G): for each of the step's G global slots, its domain (index into
        `domains`) and that domain's sequence number (slot order within a domain is increasing)."""
        first_D, count_D = self.counts(step)
        dom_G = np.repeat(np.arange(len(self.domains), dtype=np.int64), count_D)[slot_order(self.seed, step, self.G)]
        idx_G = np.empty(self.G, np.int64)
        for d in np.flatnonzero(count_D):
            at = np.flatnonzero(dom_G == d)
            idx_G[at] = first_D[d] + np.arange(len(at))
        return dom_G, idx_G


def corpus_domains(corpus: str) -> list[str] | None:
    """The domains a mixture may name, known without reading text: the embedded corpus's and a
    prepared corpus's (its manifest); None for others (the loader checks them when it opens)."""
    if corpus == "embedded":
        return list(EMBEDDED_SOURCES)
    m = Path(corpus).expanduser() / "manifest.json"
    return list(json.loads(m.read_text()).get("domains", {})) if corpus != "paloma" and m.is_file() else None


def check_mixture_domains(data: Any) -> None:
    """ValueError naming DataConfig.mixture when a phase names a domain the corpus does not have
    (before any run: `validate_data`, and `plan`/`run` for every run of a study)."""
    if not data.mixture:
        return
    names = corpus_domains(data.corpus)
    unknown = sorted({d for ph in data.mixture for d, _ in ph.weights} - set(names)) if names is not None else []
    if unknown:
        raise ValueError(f"DataConfig.mixture names domain(s) {unknown} that DataConfig.corpus={data.corpus!r} does "
                         f"not have; allowed values: {', '.join(map(repr, names)) or '(no domains)'} "
                         f"(state this corpus's phases with --data.mixture=0:A=1+B=1,0.8:A=1+B=2, or none with "
                         f"--data.mixture=)")
