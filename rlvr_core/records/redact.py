"""Secrets kept out of every record (docs/tracking.md): values under credential-like names (`is_secret_key`,
`redact`) and passwords inside URLs (`redact_url`, `redact_text`). The MLflow params and tags, the warehouse's
tables, the manifests, the reports and the rollout traces all pass through these."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
# Secret key names (`is_secret_key`): these anywhere in the name (`db_password`, `aws_secret_access_key`,
# `google_credentials`), ...
_SECRET_PART = re.compile(r"password|passwd|passphrase|secret|credential|private_?key|api_?key|access_?key")
# ... these as a whole word (`auth`, `basic_auth`, `authorization`, `session_cookie`) ...
_SECRET_WORDS = frozenset({"auth", "authorization", "cookie", "bearer"})
# ... and `token` as the name's last word (`token`, `hf_token`, `access_token`, `MLFLOW_TRACKING_TOKEN`), except
# a tokenizer's special tokens: a *count* of tokens (`max_new_tokens`, `tokens_per_s`) or a `tokenizer`
# never ends in the word `token`.
_TOKENIZER_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special"})


def redact_url(value: str) -> str:
    """Drop the password from a URL's userinfo: `http://u:pw@host` → `http://u:***@host`.

    MLflow and requests accept credentials inside the tracking URI; anything we record (params, tags,
    summaries, manifests, index pages) must not carry them."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or "@" not in parts.netloc:
        return value
    userinfo, host = parts.netloc.rsplit("@", 1)
    # `user:password@` keeps the user; a lone `token@` (tokens passed as the user name) goes entirely.
    user, has_password = userinfo.split(":", 1)[0], ":" in userinfo
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}" if user and has_password
                                     else f"{REDACTED}@{host}"))


# A URL with userinfo (`scheme://user:pw@host`); also used as an RE2 pattern over whole table columns (runrecord).
URL_WITH_USERINFO = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/@'\"<>]+@[^\s'\"<>]*")


def redact_text(text: str) -> str:
    """`redact_url` applied to every URL with credentials inside free text (a report, a log line)."""
    return URL_WITH_USERINFO.sub(lambda m: redact_url(m.group(0)), text)


def is_secret_key(name: str) -> bool:
    """Whether a value stored under `name` (a config key, flattened `a.b_token`, env-style `HF_TOKEN` or
    camelCase `apiToken`) is a credential; only the last dotted segment counts."""
    last = re.split(r"[./]", str(name))[-1]
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", last).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", snake) if w]
    if not words:
        return False
    if _SECRET_PART.search(snake) or _SECRET_WORDS.intersection(words):
        return True
    return words[-1] == "token" and not (len(words) == 2 and words[0] in _TOKENIZER_TOKENS)


def redact(value: Any, key: str = "") -> Any:
    """Recursively redact secrets in a config-like structure: values under secret-looking keys, and
    passwords inside URLs."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value)
    return value


def text_without_credentials(text: str) -> str:
    """An exception's text with any URL's userinfo masked (MLflow puts the full tracking URI in them)."""
    return re.sub(r"(?<=://)[^/@\s]+@", f"{REDACTED}@", text)
