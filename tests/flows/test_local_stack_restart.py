"""`prefect_up` on a restart: the setup and `prefect deploy` (10-20 s of `rlvr stack up`) are skipped only when the
server's database already holds what they would make (flows/local_stack.py), against a real Prefect API."""

from __future__ import annotations

from flows import local_stack as ls


def test_deploy_fingerprint_kept_on_the_server_and_what_changes_it(prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value().rstrip("/")
    env = ls.stack_env(tmp_path, api)
    fp = ls.deploy_fingerprint(env, gpu_slots=2)
    assert ls._server_variable(api) is None  # a fresh database: set up and deploy
    ls._set_server_variable(api, fp)
    assert ls._server_variable(api) == fp
    ls._set_server_variable(api, "other")  # a second deploy on the same database updates it
    assert ls._server_variable(api) == "other"
    # What the deployments are made of changes the fingerprint: the schedule, the GPU slots, the checkout.
    assert ls.deploy_fingerprint(env, gpu_slots=2) == fp
    assert ls.deploy_fingerprint({**env, "RLVR_NIGHTLY_CRON": "0 * * * *"}, gpu_slots=2) != fp
    assert ls.deploy_fingerprint(env, gpu_slots=1) != fp
    assert ls.deploy_fingerprint({**env, "RLVR_PROJECT_ROOT": "/elsewhere"}, gpu_slots=2) != fp
    # The fingerprint alone is not enough: the deployments of prefect.yaml must be there (none on this server).
    assert ls._deployments_there(api) is False
