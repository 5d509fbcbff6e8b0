"""Reading runs: run folders to the results table (`results`) and tables from elsewhere (`importer`)."""
