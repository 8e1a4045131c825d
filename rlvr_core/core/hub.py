"""Models and data sets by Hugging Face hub id, through huggingface_hub's own cache.

Why: a user names `Qwen/Qwen2.5-0.5B` or `openai/gsm8k` as every peer tool accepts, and gets the same
bytes on every machine. Downloads go into huggingface_hub's cache (`$HF_HOME/hub`, or `$HF_HUB_CACHE`), so
other tools share them. The cache is always asked first, so a branch name (`main`) is resolved to a commit
once, when first fetched, and that commit is what every result records. With `HF_HUB_OFFLINE=1` (or no
network) only the cache is used, and a missing snapshot is a `HubMissing` error whose one line says which
`rlvr pull` to run on a machine with network.

References: `org/name` or `org/name@revision` (a commit hash, a branch or a tag).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_core.core.manifest import file_sha256

__all__ = ["HubMissing", "Snapshot", "split_ref", "is_hub_id", "offline", "snapshot", "COMMIT"]

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubMissing(RuntimeError):
    """A snapshot that is neither in the cache nor downloadable now; `str()` is one line saying what to run."""


@dataclass(frozen=True)
class Snapshot:
    """One resolved snapshot: where its files are and exactly which commit they are."""

    repo: str
    repo_type: str           # "model" or "dataset"
    requested: str | None    # the revision asked for (None = the default branch)
    commit: str              # the commit the files are from (the snapshot folder's name)
    folder: Path
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256

    def record(self) -> dict[str, Any]:
        """What a manifest or result stores about it (JSON-safe)."""
        return {"repo": self.repo, "repo_type": self.repo_type, "revision": self.requested,
                "commit": self.commit, "files": dict(self.files)}


def split_ref(ref: str) -> tuple[str, str | None]:
    """'org/name@rev' -> ('org/name', 'rev'); 'org/name' -> ('org/name', None)."""
    repo, _, rev = ref.partition("@")
    return repo, (rev or None)


def is_hub_id(ref: str) -> bool:
    """True when `ref` names a hub repo (org/name[@rev]) and is not an existing local path."""
    repo, _ = split_ref(ref)
    return bool(_REPO.match(repo)) and not Path(ref).expanduser().exists() and not ref.startswith((".", "~"))


def offline() -> bool:
    """HF_HUB_OFFLINE set to a true value: use the cache only (read at call time, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _advice(repo: str, revision: str | None, repo_type: str, pull: str | None, pulling: bool) -> str:
    """What to do about a snapshot that is neither cached nor downloadable here. `pulling`: the caller is
    `rlvr pull` itself, so the advice is where to run it, not to run it."""
    ref = repo + (f"@{revision}" if revision else "")
    cmd = pull or (f"rlvr pull model {ref}" if repo_type == "model" else "rlvr pull benchmark <the benchmark reading it>")
    todo = ("run this `rlvr pull` where there is network, with the same HF_HOME (or copy that cache folder here)"
            if pulling else f"run `{cmd}` where there is network, with the same HF_HOME")
    # `models/Qwen2.5-0.5B` reads as a hub id too: say so when the user may have meant a local folder.
    return todo + (f"; or, for a local folder: there is no folder {repo}" if repo_type == "model" else "")


_NETWORK = ("ConnectError", "ConnectTimeout", "ConnectionError", "Name or service not known", "Connection refused",
            "Network is unreachable", "Temporary failure in name resolution", "timed out")


def _why_not_downloaded(e: Exception) -> str:
    """The download's failure in a few words: no connection, or the hub's answer (no such repo or revision)."""
    chain, cause = [], e
    while cause is not None and len(chain) < 5:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(f"{type(c).__name__}: {c}" for c in chain)
    if any(marker in text for marker in _NETWORK):
        from huggingface_hub import constants

        return f"no connection to {constants.ENDPOINT}"
    line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def snapshot(repo: str, *, repo_type: str = "model", revision: str | None = None,
             allow_patterns: list[str] | None = None, pull: str | None = None,
             hash_files: bool = True, pulling: bool = False, local_only: bool = False) -> Snapshot:
    """The snapshot of `repo` at `revision`: from the cache, else downloaded (unless offline).

    allow_patterns: only these files (globs; a data set's split files). pull: the command a `HubMissing`
    error names (default `rlvr pull model REF` for a model); `pulling`: the caller is that command. Raises
    HubMissing, one line, when the snapshot is not cached and cannot be downloaded now. `local_only`: the
    cache only, as with HF_HUB_OFFLINE (a teacher read while training: nothing is downloaded then).
    """
    from huggingface_hub import snapshot_download

    kw = dict(repo_type=repo_type, revision=revision, allow_patterns=allow_patterns, cache_dir=_cache_dir())
    advice = _advice(repo, revision, repo_type, pull, pulling)
    missing = f"{repo_type} {repo + (f'@{revision}' if revision else '')} is not in the Hugging Face cache " \
              f"({_cache_dir()})"
    try:
        folder = Path(snapshot_download(repo, local_files_only=True, **kw))
        if allow_patterns and not _matches(folder, allow_patterns):
            raise FileNotFoundError(f"no {allow_patterns} in the cached snapshot")
    except Exception:  # noqa: BLE001 — not cached (huggingface_hub raises several kinds): download or say so
        if offline() or local_only:
            why = "HF_HUB_OFFLINE is set" if offline() else "it is read from the cache only here"
            raise HubMissing(f"{missing} and {why}: {advice}") from None
        try:
            folder = Path(snapshot_download(repo, **kw))
        except Exception as e:  # noqa: BLE001 — no network, no such repo or revision: one line either way
            raise HubMissing(f"{missing} and could not be downloaded ({_why_not_downloaded(e)}): {advice}") from None
    files = _files(folder, allow_patterns) if hash_files else {}
    return Snapshot(repo, repo_type, revision, folder.name, folder, files)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME")
                                              else constants.HF_HUB_CACHE)


def _matches(folder: Path, patterns: list[str]) -> list[Path]:
    return sorted({p for pat in patterns for p in folder.glob(pat) if p.is_file()})


def _files(folder: Path, patterns: list[str] | None) -> dict[str, str]:
    found = _matches(folder, patterns) if patterns else sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in found}
