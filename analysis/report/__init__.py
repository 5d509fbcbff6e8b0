"""The report: its writer (`writer`: markdown + HTML), findings in prose, figures, provenance."""
