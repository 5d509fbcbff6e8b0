"""The call path a reader follows from `marin-ablate run` to the first training step, measured with sys.setprofile.

`python tests/repo/call_path.py` prints the walk as a numbered table and its two counts.

Definition. The command runs in this process (the `debug` executor trains here) under `sys.setprofile`;
every call of a function defined in one of the project's packages is recorded, and the command stops at
the first call of `Trainer.train_step`. The *spine* is the stack of project functions at that moment
(entry -> ... -> step). The *walk* is what a reader reads: each spine function and, in call order, every
project function a spine function calls directly (one level of side calls; comprehensions, lambdas and
non-project frames between them are looked through; module bodies run by an import are not calls).
Each walked function is named by its module; consecutive repeats collapse into one *stop*, and a
*return* is a stop at a module an earlier stop already showed.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "marin_ablate"
FIRST_STEP = "Trainer.train_step"


class _Reached(BaseException):
    """Raised from the profile function at the first step: unwinds the command without running it further."""


@dataclass(frozen=True)
class Call:
    seq: int
    module: str
    function: str


def _module_of(frame) -> str | None:
    """The project module a frame runs in (its installed name), None outside the package."""
    name = frame.f_globals.get("__name__") or ""
    return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


def trace(argv: list[str], first_step: str = FIRST_STEP) -> tuple[list[Call], list[Call]]:
    """(spine, walk) of `marin-ablate ARGV` up to the first call of `first_step` (a qualified name)."""
    from marin_ablate.cli.main import main

    seq = 0
    born: dict[int, int] = {}  # id(frame) -> seq of its latest call: a live frame's id is never reused
    events: list[tuple[int, int, str, str]] = []  # (seq, id of the reader's caller frame, module, qualname)
    reached: list = []

    def reader_caller(frame):
        """The nearest project function frame above `frame`, looking through comprehensions and foreign code."""
        f = frame.f_back
        while f is not None:
            if _module_of(f) and not f.f_code.co_name.startswith("<"):
                return f
            if f.f_code.co_name == "<module>":
                return None  # run by an import, not by a call
            f = f.f_back
        return None

    def profile(frame, event, arg):
        nonlocal seq
        if event != "call":
            return
        code = frame.f_code
        module = _module_of(frame)
        if module is None or code.co_name.startswith("<"):
            return
        seq += 1
        born[id(frame)] = seq
        caller = reader_caller(frame)
        events.append((seq, id(caller) if caller is not None else 0, module, code.co_qualname))
        if code.co_qualname == first_step:
            reached.append(frame)
            raise _Reached

    sys.setprofile(profile)
    try:
        main(argv)
    except _Reached:
        pass
    finally:
        sys.setprofile(None)
    if not reached:
        raise RuntimeError(f"`marin-ablate {' '.join(argv)}` never called {first_step}")
    stack, f = [], reached[0]
    while f is not None:
        if _module_of(f) and not f.f_code.co_name.startswith("<"):
            stack.append(f)
        f = f.f_back
    stack.reverse()
    spine_born = {id(f): born[id(f)] for f in stack}
    by_seq = {s: (m, q) for s, _, m, q in events}
    spine = [Call(spine_born[id(f)], *by_seq[spine_born[id(f)]]) for f in stack]
    # a side call: its caller is a spine frame, made after that frame was born (an earlier frame may have had its id)
    walk = {Call(s, m, q) for s, caller, m, q in events if caller in spine_born and s > spine_born[caller]}
    return spine, sorted(walk | set(spine), key=lambda c: c.seq)


def stops(modules: list[str]) -> list[str]:
    """Consecutive repeats collapsed: the modules a reader stops in, in order."""
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


def returns(modules: list[str]) -> int:
    """How many stops are at a module an earlier stop already showed."""
    seen, n = set(), 0
    for m in stops(modules):
        n += m in seen
        seen.add(m)
    return n


def run_smoke(out: Path) -> tuple[list[Call], list[Call]]:
    return trace(["run", "smoke", "--executor", "debug", "--out", str(out)])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        spine, walk = run_smoke(Path(d))
    spine_seqs = {c.seq for c in spine}
    path = stops([c.module for c in walk])
    seen: set[str] = set()
    i = 0
    for k, c in enumerate(walk):
        if k and walk[k - 1].module == c.module:
            mark = ""
        else:
            i += 1
            mark = "return" if c.module in seen else ""
            seen.add(c.module)
        print(f"{i:>3} {'spine' if c.seq in spine_seqs else 'side ':<5} {mark:<6} {c.module}:{c.function}")
    print(f"\n{len(path)} stops, {returns([c.module for c in walk])} returns to a module already left "
          f"({len(spine)} spine functions, {len(walk)} functions walked)")
