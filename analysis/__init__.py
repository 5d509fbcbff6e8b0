"""marin-ablate analysis: results table -> reference law -> multipliers -> attribution -> report (docs/method.md §4).

Never imports torch, and of the model library only its torch-free record modules (`marin.fields`, `marin.plugins`,
`marin.schema`; tests/analysis/test_analysis_report.py checks the list), so notebooks open fast.
By job: `io` (run folders -> table, tables from elsewhere, the pinned law's file), `responses` (what is
attributed: one table), `fit` (the joint law + quality effects, attribution, regimes, replicates, bootstrap,
checks), `ofat` (one-factor-at-a-time studies), `calibration` (precision planning, simulation, forecasts),
`report` (writer, findings, plots, provenance), `pipeline` (the whole analysis of a table) and `study_folder` (a
study folder analysed: `analyze_study`, what the commands, the notebook and the benchmarks call).
"""
