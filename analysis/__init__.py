"""marin-ablate analysis: results table -> reference law -> multipliers -> attribution -> report (docs/method.md §4;
its modules by job: docs/architecture.md §1). Never imports torch, and of the model library only its torch-free
record modules (`marin.fields`, `marin.plugins`, `marin.schema`; tests/analysis/test_analysis_report.py checks the
list), so notebooks open fast.
"""
