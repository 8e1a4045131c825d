"""What a run leaves behind for people: MLflow tracking, the DuckDB warehouse and its canned queries, the run
folder's record files, and the HTML run report."""
