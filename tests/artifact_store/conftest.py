"""The artifact store both ways the pipeline writes it: a local folder and S3 (moto_server on 127.0.0.1)."""

from __future__ import annotations

import pytest

from rlvr_core.artifacts.storage import LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_env")
    return open_store(f"s3://{bucket}/artifacts", endpoint_url=endpoint)
