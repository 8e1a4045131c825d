"""What a run leaves behind for people: MLflow tracking, the DuckDB warehouse and its canned queries, run records, and the HTML run report."""
