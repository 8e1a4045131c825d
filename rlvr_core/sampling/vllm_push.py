"""The worker extension under the name servers may have been started with
(`--worker-extension-cls rlvr_core.sampling.vllm_push.RlvrWeightPushExtension`); the backend lives in
`rlvr_core/sampling/weight_push/vllm_backend.py`."""

from rlvr_core.sampling.weight_push.vllm_backend import RlvrWeightPushExtension

__all__ = ["RlvrWeightPushExtension"]
