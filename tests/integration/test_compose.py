"""infra/compose: the Docker team stack parses, has the services and ports docs/stack.md promises,
and matches `rlvr stack up` (same default ports, same MLflow version as the client). No Docker needed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import yaml

from rlvr_core.pipeline import stack

COMPOSE = Path(__file__).resolve().parents[2] / "infra" / "compose"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "stack.md"


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def _published(service: dict) -> dict[int, str]:
    """container port → the host side spec, e.g. 5000 → '${BIND_ADDRESS:-127.0.0.1}:${MLFLOW_PORT:-5000}'."""
    out = {}
    for p in service.get("ports", []):
        host, container = p.rsplit(":", 1)
        out[int(container)] = host
    return out


def _default(spec: str, var: str) -> str:
    m = re.search(r"\$\{" + var + r":-([^}]+)\}", spec)
    assert m, f"{spec!r} has no default for {var}"
    return m.group(1)


def test_services_and_loopback_ports():
    services = _compose()["services"]
    assert set(services) == {"postgres", "minio", "createbuckets", "mlflow", "prefect"}
    expected = {"mlflow": (5000, "MLFLOW_PORT", stack.DEFAULT_MLFLOW_PORT), "minio": (9000, "S3_PORT", stack.DEFAULT_S3_PORT),
                "postgres": (5432, "POSTGRES_PORT", stack.DEFAULT_PG_PORT),
                "prefect": (4200, "PREFECT_PORT", stack.DEFAULT_PREFECT_PORT)}
    docs = DOCS.read_text()
    for name, (container, var, port) in expected.items():
        host = _published(services[name])[container]
        assert _default(host, "BIND_ADDRESS") == "127.0.0.1", name  # nothing published beyond this machine by default
        assert int(_default(host, var)) == port, name
        assert f"127.0.0.1:{port}" in docs, f"docs/stack.md does not document {name} on port {port}"


def test_mlflow_serves_artifacts_from_the_bucket_on_postgres():
    svc = _compose()["services"]["mlflow"]
    cmd = " ".join(svc["command"].split())
    assert "--serve-artifacts" in cmd and "--artifacts-destination s3://${RLVR_BUCKET:-rlvr}/mlflow" in cmd
    assert "--backend-store-uri postgresql://" in cmd
    assert svc["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert svc["depends_on"]["createbuckets"]["condition"] == "service_completed_successfully"
    # The server runs the same MLflow as the pipeline's client.
    dockerfile = (COMPOSE / "mlflow" / "Dockerfile").read_text()
    assert f"mlflow=={metadata.version('mlflow')}" in dockerfile


def test_every_variable_is_in_env_example():
    text = (COMPOSE / "docker-compose.yml").read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", text))
    example = {line.split("=", 1)[0] for line in (COMPOSE / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    assert used and used <= example, sorted(used - example)
