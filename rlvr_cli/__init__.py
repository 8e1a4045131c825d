"""The `rlvr` command line: typer commands over rlvr_core and the Prefect flows."""
