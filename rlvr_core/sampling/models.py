"""Model directories: load one like any hub model (local files only), and hash its weights and tokenizer
(the hashes every result records, so two results name the exact model they came from)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from rlvr_core.core.manifest import file_sha256

__all__ = ["load_model", "model_hashes"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def load_model(path: str | Path, dtype: str = "float32"):
    """Load a model directory like any hub model: from_pretrained on local files only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
    model.eval()
    return model, tok


def model_hashes(path: Path) -> tuple[str, str]:
    """(weights hash, tokenizer hash) of a model directory."""
    weights = sorted(list(path.glob("*.safetensors")) + list(path.glob("*.bin")) + [path / "config.json"])
    model_hash = _files_hash([f for f in weights if f.is_file()])
    tok_hash = _files_hash([path / f for f in TOKENIZER_FILES if (path / f).is_file()])
    return model_hash, tok_hash


def _files_hash(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + file_sha256(f).encode())
    return h.hexdigest()
