"""Problem rows: loading public sets (loaders), the demo's synthetic task (synthetic), JSONL reading (jsonl),
and the gold answer of a row (gold: the one place it is decided)."""

from rlvr_core.data.gold import gold_of, line_gold

__all__ = ["gold_of", "line_gold"]
