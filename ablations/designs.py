"""Two-level designs: full factorials and regular fractions, each verified by our own algebra.

Matrices are built by `pydoe` (module `pydoe`, PyPI `pydoe>=1.6`: `fracfact`, `fracfact_by_res`,
`ff2n`); we do not trust a library's resolution claim (docs/method.md §4.5; pyDOE3 mislabels some). Every
regular design is checked three ways on construction:

1. the defining relation from the generators (all products of the generator words);
2. the defining relation read back from the design matrix (GF(2) span of its columns), which must
   equal (1) word for word and sign for sign;
3. a brute-force scan that no set of fewer columns than the resolution has a constant product.

A design labelled with a resolution its defining relation does not support raises ValueError.
Notation: factors are lettered A, B, C, ... in design order, skipping I (the identity of the
defining relation); a word is a product of factor letters; a regular fraction 2^(n-p) has p
generators "F=ABCDE" (F's column is the product of A..E; "F=-ABCDE" its negative).
Reference: Box, Hunter & Hunter, Statistics for Experimenters (2005), ch. 6; Montgomery,
Design and Analysis of Experiments (2012), ch. 8."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

LETTERS = "ABCDEFGHJKLMNOPQRSTUVWXYZ"  # no I: I names the identity word
KINDS = ("full", "fraction", "arms")
_ROMAN = {1: "I", 2: "II", 3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII", 9: "IX", 10: "X",
          11: "XI", 12: "XII"}
# Exhaustive generator search (designs with a requested run count) gives up beyond this many candidates.
_SEARCH_LIMIT = 200_000


def roman(r: int | None) -> str:
    return "full" if r is None else _ROMAN.get(r, str(r))


def _popcount(x: int) -> int:
    return bin(x).count("1")


# ---- Words (bitmasks over factor indices) and defining relations ---------------------------------


def word_str(mask: int, letters: str, sign: int = 1) -> str:
    s = "".join(letters[i] for i in range(len(letters)) if mask >> i & 1) or "I"
    return ("-" if sign < 0 else "") + s


def parse_word(text: str, letters: str) -> int:
    mask = 0
    for ch in text:
        if ch not in letters:
            raise ValueError(f"letter {ch!r} in {text!r} names no factor; allowed values: {', '.join(letters)}")
        bit = 1 << letters.index(ch)
        if mask & bit:
            raise ValueError(f"letter {ch!r} repeats in {text!r}")
        mask |= bit
    return mask


def parse_generator(text: str, letters: str) -> tuple[int, int, int]:
    """'F=ABCDE' -> (index of F, mask of ABCDE, sign). Letters are design letters (A.., no I)."""
    m = re.fullmatch(r"\s*([A-Za-z])\s*=\s*([+-]?)\s*([A-Za-z]+)\s*", text)
    if not m:
        raise ValueError(f"generator {text!r} must look like 'F=ABCDE' or 'F=-ABCDE'")
    lhs, sgn, rhs = m.group(1).upper(), m.group(2), m.group(3).upper()
    if lhs not in letters:
        raise ValueError(f"generator {text!r}: {lhs!r} names no factor; allowed values: {', '.join(letters)}")
    rmask = parse_word(rhs, letters)
    if rmask >> letters.index(lhs) & 1:
        raise ValueError(f"generator {text!r} defines {lhs} by itself")
    if _popcount(rmask) < 2:
        raise ValueError(f"generator {text!r} aliases two main effects (its word has length < 3)")
    return letters.index(lhs), rmask, -1 if sgn == "-" else 1


def parse_generators(generators: Sequence[str], letters: str) -> list[tuple[int, int, int]]:
    """`parse_generator` of each; a factor defined twice, or defined by a generated one, raises ValueError."""
    parsed = [parse_generator(g, letters) for g in generators]
    targets = [t for t, _, _ in parsed]
    if len(set(targets)) != len(targets):
        raise ValueError(f"generators {list(generators)} define a factor twice")
    for g, (_, m, _) in zip(generators, parsed, strict=True):
        bad = [letters[t] for t in targets if m >> t & 1]
        if bad:
            raise ValueError(f"generator {g!r} uses generated factor(s) {bad}; write it in base factors only")
    return parsed


def close_words(generator_words: Sequence[tuple[int, int]]) -> dict[int, int]:
    """All products of generator words: {word mask: sign}, identity (0) included with sign +1.
    Raises ValueError when the generators are dependent (a product of some of them is I or -I)."""
    group = {0: 1}
    for w, s in generator_words:
        new = {}
        for g, gs in group.items():
            prod = g ^ w
            if prod in group or prod in new:
                raise ValueError("generators are not independent: a product of generator words is the identity")
            new[prod] = gs * s
        group.update(new)
    return group


def matrix_words(matrix: np.ndarray) -> tuple[dict[int, int], list[int]]:
    """Defining relation read from a ±1 matrix: ({word mask: sign}, basis column indices).
    Columns are vectors over GF(2) (a -1 entry is a 1 bit), so a product of columns is an XOR and a
    constant product (a word) is a set of columns whose XOR is all-0 (+I) or all-1 (-I). Raises
    ValueError unless the matrix is a regular two-level fraction (basis columns a full factorial)."""
    M = np.asarray(matrix)
    n_rows, n = M.shape
    if not np.all(np.isin(M, (-1, 1))):
        raise ValueError("design matrix entries must be -1 or +1")
    pats = [int("".join("1" if v < 0 else "0" for v in M[:, j]) or "0", 2) for j in range(n)]
    full = (1 << n_rows) - 1
    span = {0: 0}  # pattern -> mask of basis columns whose product it is
    basis: list[int] = []
    gens: list[tuple[int, int]] = []
    for j, p in enumerate(pats):
        if p in span:
            gens.append((span[p] | 1 << j, 1))
        elif p ^ full in span:
            gens.append((span[p ^ full] | 1 << j, -1))
        else:
            span.update({q ^ p: m | 1 << j for q, m in list(span.items())})
            basis.append(j)
    if n_rows != 2 ** len(basis) or len({tuple(r) for r in M[:, basis]}) != n_rows:
        raise ValueError(f"design matrix with {n_rows} rows is not a regular two-level fraction: its "
                         f"{len(basis)} independent columns need exactly {2 ** len(basis)} distinct rows")
    return close_words(gens), basis


def _roman_res(words: dict[int, int]) -> int | None:
    lengths = [_popcount(w) for w in words if w]
    return min(lengths) if lengths else None


# ---- The design ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    """A two-level design over named factors: rows of ±1 codes, +1 = high (recipe) level.
    kind "full" (2^n), "fraction" (regular 2^(n-p) from `generators`) or "arms" (an explicit list of
    rows, e.g. the seed panel's all-on / all-off; no alias structure). `label_resolution` is the
    resolution the design claims; construction raises if the defining relation does not support it.
    Build with `full_factorial`, `fraction`, `arms`; the constructor verifies whatever it is given."""

    factors: tuple[str, ...]
    matrix: tuple[tuple[int, ...], ...]
    generators: tuple[str, ...] = ()
    kind: str = "fraction"
    label_resolution: int | None = None
    source: str = ""  # how it was built (for the plan): "pydoe.fracfact('a b c d e abcde')" etc.
    labels: tuple[str, ...] = ()  # "arms" designs: each row's arm name (default: its sign string)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factors", tuple(self.factors))
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.labels and (len(self.labels) != len(self.matrix) or len(set(self.labels)) != len(self.labels)
                            or not all(isinstance(x, str) and x.isidentifier() for x in self.labels)):
            raise ValueError(f"Design.labels={self.labels}: allowed values: one distinct identifier per row "
                             f"({len(self.matrix)} rows)")
        object.__setattr__(self, "matrix", tuple(tuple(int(v) for v in r) for r in self.matrix))
        object.__setattr__(self, "generators", tuple(self.generators))
        if self.kind not in KINDS:
            raise ValueError(f"Design.kind={self.kind!r}; allowed values: {', '.join(KINDS)}")
        n = len(self.factors)
        if n > len(LETTERS):
            raise ValueError(f"a design takes at most {len(LETTERS)} factors, got {n}")
        if len(set(self.factors)) != n:
            raise ValueError(f"Design.factors repeat a name: {self.factors}")
        if not self.matrix or any(len(r) != n for r in self.matrix):
            raise ValueError(f"Design.matrix must be a non-empty list of rows of {n} codes")
        if any(v not in (-1, 1) for r in self.matrix for v in r):
            raise ValueError("Design.matrix entries must be -1 or +1")
        if self.labels and self.kind != "arms":
            raise ValueError(f"Design.labels name the rows of an 'arms' design; this one is {self.kind!r}")
        if self.kind == "arms":
            if self.generators or self.label_resolution is not None:
                raise ValueError("an 'arms' design has no generators or resolution")
            return
        if self.kind == "full" and self.generators:
            raise ValueError("a full factorial has no generators")
        self.verify()

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.factors)]

    @property
    def n_factors(self) -> int:
        return len(self.factors)

    @property
    def n_runs(self) -> int:
        return len(self.matrix)

    @property
    def array(self) -> np.ndarray:
        return np.array(self.matrix, dtype=int).reshape(self.n_runs, self.n_factors)

    @cached_property
    def words(self) -> dict[int, int]:
        """Defining relation {word mask: sign} (without I), computed from the generators."""
        if self.kind == "arms":
            raise ValueError("an 'arms' design has no defining relation")
        w = close_words([(m | 1 << t, s) for t, m, s in parse_generators(self.generators, self.letters)])
        w.pop(0)
        return w

    @property
    def resolution(self) -> int | None:
        """Length of the shortest word of the defining relation; None for a full factorial."""
        return _roman_res(self.words)

    def defining_relation(self) -> list[str]:
        """['I', 'ABCDEF', ...]: I followed by every word, shortest first."""
        order = sorted(self.words, key=lambda w: (_popcount(w), [-(w >> i & 1) for i in range(self.n_factors)]))
        return ["I"] + [word_str(w, self.letters, self.words[w]) for w in order]

    def word_length_pattern(self) -> dict[int, int]:
        """{word length: count}; the minimum-aberration criterion compares these from short to long."""
        return dict(sorted(Counter(_popcount(w) for w in self.words).items()))

    def aliases(self, effect: str | int, max_order: int | None = None) -> list[str]:
        """Effects confounded with `effect` (a word like 'AB'), signed, shortest first."""
        e = parse_word(effect, self.letters) if isinstance(effect, str) else effect
        out = [(e ^ w, s) for w, s in self.words.items()]
        out = [(a, s) for a, s in out if max_order is None or _popcount(a) <= max_order]
        out.sort(key=lambda t: (_popcount(t[0]), [-(t[0] >> i & 1) for i in range(self.n_factors)]))
        return [word_str(a, self.letters, s) for a, s in out]

    def alias_table(self, max_order: int = 3) -> dict[str, list[str]]:
        """For every main effect and two-factor interaction: its aliases of order <= max_order."""
        n = self.n_factors
        effects = [1 << i for i in range(n)] + [1 << i | 1 << j for i, j in itertools.combinations(range(n), 2)]
        return {word_str(e, self.letters): self.aliases(e, max_order) for e in effects}

    def clear(self, effect: str) -> bool:
        """An effect is clear when no main effect or 2FI is among its aliases."""
        return not self.aliases(effect, max_order=2)

    @property
    def main_effects_clear(self) -> bool:
        return all(self.clear(l) for l in self.letters)

    @property
    def all_2fi_estimable(self) -> bool:
        """Every main effect and 2FI clear of every other main effect and 2FI (needs resolution >= V)."""
        if self.kind == "arms":
            return False
        return self.main_effects_clear and all(self.clear(a + b) for a, b in itertools.combinations(self.letters, 2))

    def verify(self) -> None:
        """Raise ValueError unless generators, matrix and label agree (see the module docstring)."""
        n, p = self.n_factors, len(self.generators)
        if self.n_runs != 2 ** (n - p):
            raise ValueError(f"a 2^({n}-{p}) design has {2 ** (n - p)} runs, the matrix has {self.n_runs}")
        words = self.words
        mwords, _ = matrix_words(self.array)
        mwords.pop(0)
        if mwords != words:
            gen = sorted(word_str(w, self.letters, s) for w, s in words.items())
            mat = sorted(word_str(w, self.letters, s) for w, s in mwords.items())
            raise ValueError(f"design matrix does not match its generators {list(self.generators)}: "
                             f"generators give I={'='.join(gen) or '(none)'}, the matrix I={'='.join(mat) or '(none)'}")
        res = self.resolution
        self._scan_products(res)
        if self.label_resolution is not None and res is not None and self.label_resolution > res:
            shortest = min(words, key=_popcount)
            raise ValueError(f"design labelled resolution {roman(self.label_resolution)} has resolution {roman(res)}: "
                             "its defining relation contains the word "
                             f"{word_str(shortest, self.letters, words[shortest])} "
                             f"of length {_popcount(shortest)} (I={'='.join(self.defining_relation()[1:])})")

    def _scan_products(self, res: int | None) -> None:
        """Brute force: no product of fewer than `res` columns is constant; the words of length res are."""
        A = self.array
        n = self.n_factors
        top = n if res is None else res
        if sum(math.comb(n, s) for s in range(1, top + 1)) > 50_000:
            return  # the GF(2) read-back above already checked this design
        for s in range(1, top + 1):
            for cols in itertools.combinations(range(n), s):
                prod = np.prod(A[:, cols], axis=1)
                const = bool(np.all(prod == prod[0]))
                mask = sum(1 << c for c in cols)
                if const != (mask in self.words) or (const and int(prod[0]) != self.words[mask]):
                    raise ValueError(f"column products disagree with the defining relation at "
                                     f"{word_str(mask, self.letters)}")

    def describe(self, max_order: int = 3) -> dict:
        out = {"kind": self.kind, "factors": list(self.factors),
               "letters": dict(zip(self.letters, self.factors, strict=True)), "n_runs": self.n_runs,
               "source": self.source}
        if self.labels:
            out["labels"] = list(self.labels)
        if self.kind == "arms":
            out.update(resolution=None, generators=[], defining_relation=None, alias_table=None,
                       all_2fi_estimable=False, main_effects_clear=False)
            return out
        out.update(resolution=self.resolution, resolution_roman=roman(self.resolution),
                   label_resolution=self.label_resolution, generators=list(self.generators),
                   defining_relation=self.defining_relation(),
                   word_length_pattern={str(k): v for k, v in self.word_length_pattern().items()},
                   alias_table=self.alias_table(max_order), alias_max_order=max_order,
                   main_effects_clear=self.main_effects_clear, all_2fi_estimable=self.all_2fi_estimable)
        return out


# ---- Builders ------------------------------------------------------------------------------------


def _names(factors: Iterable) -> tuple[str, ...]:
    names = tuple(getattr(f, "name", f) for f in factors)
    if not names:
        raise ValueError("a design needs at least one factor")
    if len(names) > len(LETTERS):
        raise ValueError(f"a design takes at most {len(LETTERS)} factors, got {len(names)}")
    return names


def full_factorial(factors: Iterable) -> Design:
    """All 2^n level combinations (pydoe.ff2n)."""
    import pydoe

    names = _names(factors)
    H = pydoe.ff2n(len(names)).astype(int)
    return Design(names, H.tolist(), (), "full", None, f"pydoe.ff2n({len(names)})")


def _from_generators(names: tuple[str, ...], generators: Sequence[str], label: int | None, source: str = "") -> Design:
    """Build a regular fraction through pydoe.fracfact and verify it."""
    import pydoe

    letters = LETTERS[: len(names)]
    parsed = parse_generators(generators, letters)
    targets = [t for t, _, _ in parsed]
    base = [i for i in range(len(names)) if i not in targets]
    pyname = {b: "abcdefghijklmnopqrstuvwxyz"[k] for k, b in enumerate(base)}
    terms = [pyname[b] for b in base]
    terms += [("-" if s < 0 else "") + "".join(pyname[i] for i in range(len(names)) if m >> i & 1)
              for _, m, s in parsed]
    gen_str = " ".join(terms)
    H = pydoe.fracfact(gen_str).astype(int)
    order = base + targets  # pydoe's column j holds factor order[j]
    M = np.empty_like(H)
    M[:, order] = H
    canon = [f"{letters[t]}={'-' if s < 0 else ''}{word_str(m, letters)}" for t, m, s in parsed]
    kind = "fraction" if generators else "full"
    return Design(names, M.tolist(), tuple(canon), kind, label if generators else None,
                  source or f"pydoe.fracfact({gen_str!r})")


def generators_from_matrix(matrix: np.ndarray, n_factors: int) -> list[str]:
    """Read generators back from a regular fraction's ±1 matrix (columns beyond a basis)."""
    words, basis = matrix_words(np.asarray(matrix))
    letters = LETTERS[:n_factors]
    gens = []
    bmask = sum(1 << b for b in basis)
    for j in range(n_factors):
        if j in basis:
            continue
        # the unique word containing j and otherwise only basis columns
        (w, s), = [(w, s) for w, s in words.items() if w >> j & 1 and not (w & ~bmask & ~(1 << j))]
        gens.append(f"{letters[j]}={'-' if s < 0 else ''}{word_str(w & ~(1 << j), letters)}")
    return gens


def _best_columns(n: int, k: int) -> tuple[int | None, list[int] | None, int]:
    """Exhaustive search: n factors in 2^k runs, basis = first k factors. Returns (best resolution,
    added column masks, candidates examined); the best maximises resolution, then minimises aberration.
    Resolution None means a full factorial; (None, None, count) when the search was too large."""
    if n <= k:
        return None, [], 1
    cand = [c for c in range(1, 2**k) if _popcount(c) >= 2]
    p = n - k
    if len(cand) < p:
        return 0, None, 0
    total = math.comb(len(cand), p)
    if total > _SEARCH_LIMIT:
        return None, None, total
    best_key, best = None, None
    for combo in itertools.combinations(cand, p):
        gw = [(c | 1 << (k + i), 1) for i, c in enumerate(combo)]
        words = close_words(gw)
        words.pop(0)
        wlp = [0] * (n + 1)
        for w in words:
            wlp[_popcount(w)] += 1
        res = min(_popcount(w) for w in words)
        key = (-res, wlp)
        if best_key is None or key < best_key:
            best_key, best = key, list(combo)
    return -best_key[0], best, total


def fraction(factors: Iterable, *, generators: Sequence[str] | None = None, resolution: int | None = None,
             runs: int | None = None) -> Design:
    """A regular two-level fraction, verified.
    - `generators=["F=ABCDE"]`: that fraction (built by pydoe.fracfact); with `resolution`, also a
      label the defining relation must support.
    - `resolution=R` alone: the smallest design of resolution >= R (pydoe.fracfact_by_res), generators
      read back from its matrix.
    - `resolution=R, runs=N`: a minimum-aberration design of resolution >= R in exactly N runs, found by
      our own exhaustive generator search, matrix by pydoe.fracfact. Impossible -> ValueError with the
      best resolution N runs allow and the fewest runs resolution R needs.
    - `runs=N` alone: the maximum-resolution minimum-aberration fraction in N runs."""
    import pydoe

    names = _names(factors)
    n = len(names)
    if resolution is not None and (not isinstance(resolution, int) or resolution < 3):
        raise ValueError(f"resolution={resolution!r}; allowed values: integers >= 3 (III, IV, V, ...)")
    if generators is not None:
        if runs is not None and runs != 2 ** (n - len(generators)):
            raise ValueError(f"{len(generators)} generators over {n} factors give {2 ** (n - len(generators))} runs, "
                             f"not runs={runs}")
        return _from_generators(names, list(generators), resolution)
    if runs is None:
        if resolution is None:
            raise ValueError("fraction() needs generators, resolution or runs")
        H = pydoe.fracfact_by_res(n, resolution).astype(int)
        if H.shape[0] >= 2**n:
            return full_factorial(names)
        gens = generators_from_matrix(H, n)
        # verify pydoe's own matrix against the generators we read back from it, then label it
        return Design(names, H.tolist(), tuple(gens), "fraction", resolution,
                      f"pydoe.fracfact_by_res({n}, {resolution})")
    if runs < 1 or runs & (runs - 1):
        raise ValueError(f"runs={runs}; allowed values: powers of two (2^k)")
    k = runs.bit_length() - 1
    if runs > 2**n:
        raise ValueError(f"runs={runs} exceeds the full factorial of {n} factors ({2 ** n} runs)")
    if runs < n + 1:
        raise ValueError(f"{n} factors need at least {1 << n.bit_length()} runs (distinct main-effect columns), "
                         f"asked runs={runs}")
    if k == n:
        return full_factorial(names)
    best_res, cols, examined = _best_columns(n, k)
    if cols is None:
        raise ValueError(f"searching {examined} generator sets for {n} factors in {runs} runs is too large; "
                         "pass generators= explicitly")
    if resolution is not None and best_res < resolution:
        need = _fewest_runs(n, resolution)
        raise ValueError(f"resolution {roman(resolution)} is impossible for {n} factors in {runs} runs "
                         f"(2^({n}-{n - k})): the best regular fraction there has resolution {roman(best_res)}; "
                         f"resolution {roman(resolution)} needs at least {need} runs")
    letters = LETTERS[:n]
    gens = [f"{letters[k + i]}={word_str(c, letters)}" for i, c in enumerate(cols)]
    d = _from_generators(names, gens, resolution, "")
    return Design(d.factors, d.matrix, d.generators, d.kind, resolution,
                  f"min-aberration search over {examined} generator sets; " + d.source)


def _fewest_runs(n: int, resolution: int) -> int:
    for k in range(max(1, n.bit_length()), n + 1):
        if k == n:
            return 2**n
        best, cols, _ = _best_columns(n, k)
        if cols is None:  # too large to search: trust pydoe's construction for the bound
            import pydoe

            return int(pydoe.fracfact_by_res(n, resolution).shape[0])
        if best >= resolution:
            return 2**k
    return 2**n


def arms(factors: Iterable, rows: Sequence[Sequence[int]] | Sequence[str], labels: Sequence[str] = ()) -> Design:
    """An explicit list of arms: rows of ±1 codes, or 'all_on' / 'all_off'; `labels` names them."""
    names = _names(factors)
    for r in rows:
        if isinstance(r, str) and r not in ("all_on", "all_off"):
            raise ValueError(f"arm {r!r}; allowed values: 'all_on', 'all_off' or a row of ±1 codes")
    mat = [[1] * len(names) if r == "all_on" else [-1] * len(names) if r == "all_off" else list(r) for r in rows]
    if len({tuple(r) for r in mat}) != len(mat):
        raise ValueError("arms repeat a row")
    return Design(names, mat, (), "arms", None, "explicit arms", tuple(labels))


def arm_name(design: Design, row: int) -> str:
    """The row's label, else 'all_on' / 'all_off' or the sign string over the design letters, e.g. '+-++-+'."""
    if design.labels:
        return design.labels[row]
    r = design.matrix[row]
    if all(v == 1 for v in r):
        return "all_on"
    if all(v == -1 for v in r):
        return "all_off"
    return "".join("+" if v == 1 else "-" for v in r)
