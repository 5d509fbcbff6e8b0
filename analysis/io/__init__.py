"""Reading runs: run folders to the results table (`results`), tables from elsewhere (`importer`) and the pinned
reference law's file (`pinned_law`)."""
