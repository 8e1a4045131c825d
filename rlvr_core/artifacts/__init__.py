"""Where results live: the artifact store (a local folder or S3), the local S3 server, the run-folder layout
and MLflow run names, checkpoint export, and the static index pages."""
