"""Run a command-line module as a pipeline child: `python -m rlvr_core.pipeline.child.watched MODULE ARGS...` runs
`python -m MODULE ARGS...` under the parent watch (`protocol.watch_parent`), so it stops when whoever started it
is gone. The probe flow runs `rlvr probe` this way; its report is its exit status and its output folder."""

from __future__ import annotations

import runpy
import sys

from rlvr_core.pipeline.child.protocol import watch_parent


def main(argv: list[str]) -> None:
    watch_parent(interval_s=0.5)
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
