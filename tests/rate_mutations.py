"""Mutation check of the small seeded tests that stand in for the Monte-Carlo rates of benchmarks/rates.py: each
estimator's variance (or level) off by a factor, in a copy of the tree, must make the named test fail.

A rate measured over hundreds of simulated studies lives in the benchmark; the suite keeps a few seeded studies
of each. Those tests are only worth their place if a broken estimator still fails them: an interval too narrow
(too few misses are tolerated) and one too wide (the errors' root mean square falls below its bound).

    python tests/rate_mutations.py              # every mutation; exits 1 if one survives
    python tests/rate_mutations.py --list

`tests/repo/test_rate_mutations.py` checks the table on every test run (each substitution matches once, each
named test exists); this script runs them (about 20-60 s per mutation), its latest output in docs/testing.md.
"""

from __future__ import annotations

import argparse

from fidelity_mutations import Mutation, run

M = Mutation
VAR = ("analysis/fit/attribution.py", "        return max(v, 0.0)\n")
PROFILE = ("analysis/fit/law_intervals.py", "    thr = rss0 + allow\n")
OFAT_SE = ("analysis/ofat.py", "se = float(np.sqrt(s2 * (g_law")
ATTR = "test_analysis_attribution.py::test_component_intervals_of_three_seeded_studies_cover_at_a_calibrated_width"
PLACEBO = "test_analysis_calibration.py::test_placebo_replicates_cover_and_their_scatter_matches_their_se"
SHIFTS = "test_analysis_findings.py::test_law_intervals_with_rung_shifts_cover_at_a_calibrated_width"
PROF = "test_analysis_scaling.py::test_law_profile_intervals_of_seeded_ladders_cover_at_a_calibrated_width"
NULL = "test_analysis_family.py::test_seeded_null_studies_show_no_false_verdict_where_unadjusted_intervals_would"
PINNED = ("test_pinned_law.py::"
          "test_the_pinned_linf_interval_of_eight_seeded_ladders_covers_the_planted_one_at_a_calibrated_width")
REFLAW = ("analysis/fit/reflaw.py",
          "        self.allow = self.q * self.q * (self.rss0 / self.dof if noise_var is None else noise_var)\n")
PREC = ("test_analysis_precision.py::"
        "test_predicted_halfwidth_is_within_10pct_of_the_median_realized_one_over_ten_seeded_studies")

#: (mutation, the tests of which at least one must fail); `row` names the benchmarks/rates.py rate
MUTATIONS: tuple[tuple[Mutation, tuple[str, ...]], ...] = (
    (M("attribution", "contrast variance x1/4", ((VAR[0], VAR[1], "        return max(v, 0.0) / 4\n"),)), (ATTR,)),
    (M("attribution", "contrast variance x4", ((VAR[0], VAR[1], "        return max(v, 0.0) * 4\n"),)), (ATTR,)),
    (M("placebo", "contrast variance x1/4", ((VAR[0], VAR[1], "        return max(v, 0.0) / 4\n"),)), (PLACEBO,)),
    (M("placebo", "contrast variance x4", ((VAR[0], VAR[1], "        return max(v, 0.0) * 4\n"),)), (PLACEBO,)),
    (M("law_profile", "profile threshold x1/4", ((PROFILE[0], PROFILE[1], "    thr = rss0 + allow / 4\n"),)), (PROF,)),
    (M("law_profile", "profile threshold x4", ((PROFILE[0], PROFILE[1], "    thr = rss0 + allow * 4\n"),)), (PROF,)),
    (M("law_shifts", "profile threshold x1/4", ((PROFILE[0], PROFILE[1], "    thr = rss0 + allow / 4\n"),)),
     (SHIFTS,)),
    (M("law_shifts", "profile threshold x4", ((PROFILE[0], PROFILE[1], "    thr = rss0 + allow * 4\n"),)), (SHIFTS,)),
    (M("law_shifts", "the rung clusters' mean square left out (within-cluster interval)",
       ((PROFILE[0], "        allow = max(allow, float(stats.t.ppf(0.5 + level / 2, dfb)) ** 2 * s2b)\n",
         "        allow = allow\n"),)), (SHIFTS,)),
    (M("ofat", "standard error x1/2", ((OFAT_SE[0], OFAT_SE[1], "se = 0.5 * float(np.sqrt(s2 * (g_law"),)),
     ("test_analysis_ofat.py::test_single_change_intervals_of_seeded_studies_cover_at_a_calibrated_width",)),
    (M("ofat", "standard error x2", ((OFAT_SE[0], OFAT_SE[1], "se = 2 * float(np.sqrt(s2 * (g_law"),)),
     ("test_analysis_ofat.py::test_single_change_intervals_of_seeded_studies_cover_at_a_calibrated_width",)),
    (M("null_family", "the verdict family's level x10",
       (("analysis/report/findings.py", "alpha=1 - a.level, method=FAMILY_METHOD",
         "alpha=10 * (1 - a.level), method=FAMILY_METHOD"),)), (NULL,)),
    (M("pinned_law", "the profile's allowance x1/4", ((REFLAW[0], REFLAW[1], REFLAW[1][:-1] + " / 4\n"),)), (PINNED,)),
    (M("pinned_law", "the profile's allowance x4", ((REFLAW[0], REFLAW[1], REFLAW[1][:-1] + " * 4\n"),)), (PINNED,)),
    (M("precision", "the planner's noise variance x1.5",
       (("analysis/calibration/precision.py", "    s2, r2 = noise.sd**2, noise.rung_sd**2",
         "    s2, r2 = 1.5 * noise.sd**2, noise.rung_sd**2"),)), (PREC,)),
    (M("precision", "the planner's noise variance x0.67",
       (("analysis/calibration/precision.py", "    s2, r2 = noise.sd**2, noise.rung_sd**2",
         "    s2, r2 = 0.67 * noise.sd**2, noise.rung_sd**2"),)), (PREC,)),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the mutations and their tests, run nothing")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutation (default 600)")
    args = ap.parse_args(argv)
    print("| rate | mutation | test | result | s |\n|---|---|---|---|---|")
    survived = 0
    for m, tests in MUTATIONS:
        names = ", ".join(t.split("::")[1] for t in tests)
        if args.list:
            print(f"| {m.row} | {m.what} | {names} | | |")
            continue
        result, secs = run(m, list(tests), args.timeout)
        survived += not result.startswith("caught")
        print(f"| {m.row} | {m.what} | {names} | {result} | {secs:.0f} |", flush=True)
    if not args.list:
        print(f"\n{len(MUTATIONS) - survived} of {len(MUTATIONS)} mutations caught by their small seeded test")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
