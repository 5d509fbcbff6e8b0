"""The factorial fit: the reference law and quality effects (`joint`, `lsq`, `law_intervals`, `reflaw`, `scaling`),
attribution (`attribution`, `regimes`), seeds as replicates and the bootstrap, and the checks (`checks`)."""
