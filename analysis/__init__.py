"""marin-ablate analysis: results table -> reference law -> multipliers -> attribution -> report (docs/method.md §4).

Never imports torch or `marin` (tests/analysis/test_analysis_report.py checks it), so notebooks open fast.
Modules: results (run dirs -> table), responses (what is attributed: one table), joint (law + quality
effects fit; lsq its solver), scaling (law, M_flop), attribution (effects, Shapley/LOO/AOI,
aliasing), pipeline (the whole analysis), ofat (one-factor-at-a-time studies), importer
(`marin-ablate import FILE`), forecast (pre-registration), plots, report, simulate,
commands (`marin-ablate analyze|forecast`).
"""
