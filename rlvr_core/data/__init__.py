"""Problem rows: loading public sets (loaders), the demo's synthetic task (synthetic), JSONL reading (jsonl)."""


def gold_of(row: dict) -> object:
    """The gold answer a verifier checks a completion of `row` against: `final_answer` when the row has one
    (synthetic rows: the bare number, while `answer` is the worked solution), else `answer` (loaded sets).
    The one place this is decided: the trainer, the pass-rate and evaluation stages and the probes use it."""
    return row["final_answer"] if "final_answer" in row else row["answer"]

