"""Planted verifiers for pool tests, registered as `planted_verifiers:planted_math` (the module is imported
in every worker by that name).

`planted_math` is the real math verifier plus two planted responses:
- `<<C-HANG>>`: a catastrophic regex backtrack (2^40 steps) inside the C regex engine. No signal handler
  can run until it returns, so the verifier's own CPU-time limit cannot stop it: only the pool's kill can.
- `<<SPIN s>>`: a legitimate item that needs `s` seconds of CPU time, then answers correct.

`warm_report` answers every item with the verifiers its process was warmed with (`rlvr_core.verifiers.warm.WARMED`,
inherited from the pool's forkserver), comma-separated, as `extracted`.
"""

import re
import sys
import time

from rlvr_core.verifiers.base import Outcome, Status, register_verifier
from rlvr_core.verifiers.math_verifier import MathVerifier

C_HANG = "<<C-HANG>>"


def spin(seconds: float) -> str:
    return f"<<SPIN {seconds}>>"


@register_verifier("planted_math")
class PlantedMath(MathVerifier):
    name = "planted_math"
    can_hang = True

    def verify(self, response, gold):
        if response == C_HANG:
            re.match(r"(a+)+$", "a" * 40 + "b")
            return Outcome(Status.INCORRECT, 0.0, None, self.name, self.version, "backtrack finished")
        m = re.fullmatch(r"<<SPIN ([0-9.]+)>>", response)
        if m:
            end = time.process_time() + float(m.group(1))
            while time.process_time() < end:
                pass
            return Outcome(Status.CORRECT, 1.0, None, self.name, self.version, "spun")
        return super().verify(response, gold)


@register_verifier("warm_report")
class WarmReport:
    name = "warm_report"
    version = "1"
    can_hang = False

    def warm_up(self):
        pass

    def verify(self, response, gold):
        warm = sys.modules.get("rlvr_core.verifiers.warm")
        warmed = ",".join(warm.WARMED) if warm else "<no warm-up in this process>"
        return Outcome(Status.CORRECT, 1.0, warmed, self.name, self.version, "")
