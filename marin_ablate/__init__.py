"""marin-ablate: attribute the efficiency gain of the Marin 535B-A23B MoE recipe to its components.

One import name for the layers linked in here (marin, ablations, sweeps, planning, analysis) and the command line
(`cli`); docs/architecture.md §1.
"""
