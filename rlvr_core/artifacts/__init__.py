"""Where results live: the artifact store (local or S3), the local S3 server, the run folder layout and names, checkpoint export, and the static index pages."""
