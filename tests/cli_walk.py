"""Test helper: many command lines through the real entry point in one interpreter, as a user types them.

`python tests/cli_walk.py < cases.json` reads a JSON list of argv lists, runs each through
`marin_ablate.cli.main.main(argv)` (what `python -m marin_ablate` and the `marin-ablate` script call) and prints one
JSON object per case: {"argv", "rc", "err" (its stderr lines), "escaped" (an exception that left main: a traceback the
user would see)}. One interpreter for all cases: the imports are paid once (tests/integration/test_faults_walk.py).
The machine-load probe of the time estimate (planning/costmodel.py `slowdown_now`: ~1 s of spinning per `plan`)
reads as "not measured": it prices runs and checks nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sys
import traceback

#: Seconds one command line may take here: past it the case is a hang (`escaped`), and the walk goes on.
CASE_TIMEOUT_S = 30


class Hang(BaseException):
    """Raised in a case that runs past CASE_TIMEOUT_S (a BaseException: no handler of the CLI takes it)."""


def _hang(signum, frame):
    raise Hang(f"still running after {CASE_TIMEOUT_S} s")


def run_one(argv: list[str]) -> dict:
    from marin_ablate.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    signal.signal(signal.SIGALRM, _hang)
    signal.alarm(CASE_TIMEOUT_S)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse's own exit (its usage line and error): a clean exit, not a traceback
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - what escapes main is the traceback the user would see
            rc, escaped = 1, traceback.format_exc(limit=-3)
        finally:
            signal.alarm(0)
    return {"argv": argv, "rc": rc, "err": [x for x in err.getvalue().splitlines() if x.strip()],
            "escaped": escaped}


def main() -> int:
    from marin_ablate.planning import costmodel

    costmodel.slowdown_now = lambda demand, *a, **k: (None, "not measured (tests/cli_walk.py)")
    for argv in json.load(sys.stdin):
        print(json.dumps(run_one(argv)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
