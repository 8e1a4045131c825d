-- Runs once, when the PostgreSQL volume is first created: Prefect's database next to MLflow's.
CREATE DATABASE prefect;
