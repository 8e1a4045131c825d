"""Stop strings found on the device, without decoding: a byte automaton advanced one token at a time.

Why: the `hf` engine used to decode every row's last few dozen tokens after every token and search the text
(~46 µs per row-step with a 151,936-token vocabulary: ~23 ms per step at 512 rows). Here the question "did
the newest token complete a stop string?" becomes one table lookup per row, on the device, for the whole batch.

How, for a byte-level tokenizer (GPT-2, Qwen, Llama 3 and this project's BPE): `decode(ids)` there is the
UTF-8 decoding (invalid bytes -> U+FFFD) of the concatenated bytes of the ids, skipped special tokens adding
no bytes. A stop string s (valid UTF-8, without U+FFFD) then occurs in the decoded text exactly where its
bytes occur in the byte stream: its first byte is never a continuation byte, so bytes before it cannot
swallow it. So an Aho-Corasick automaton over the stop strings' bytes, fed each token's bytes, reaches an
accepting state while reading the newest token exactly when an occurrence ends in that token, which is when
the old tail-decoding check first fires. Per token we precompute, for every automaton state q,
  code[q, id] = 4 * (state after reading id's bytes from q) + 2 * (an accepting state was passed) + is_eos[id]
so one step is `code[state, token]`, then `>> 2` and `& 3`.

The engine still confirms every candidate with the exact decode-based check (rare: once per finishing row),
so finish points equal the old ones by construction; the automaton only decides when to look.

`token_bytes` returns None (the engine then checks every row every step, as before) when the tokenizer's
decoder is not byte-level or any single token's decoding disagrees with the table.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["token_bytes", "StopAutomaton", "byte_level_chars"]


def byte_level_chars() -> dict[str, int]:
    """The byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for the
    characters 256, 257, ... in byte order (the GPT-2 convention every byte-level BPE uses)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in kept:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def token_bytes(tokenizer, vocab_size: int) -> list[bytes] | None:
    """Bytes of every id in [0, vocab_size) as `decode(..., skip_special_tokens=True)` sees them (b"" for
    skipped special tokens and ids the tokenizer lacks), or None when decoding is not byte concatenation.

    Checked, not assumed: every id's own decoding must equal its bytes decoded with U+FFFD for invalid ones
    (~1 s for 151,936 ids; the automaton table from it ~0.1 s)."""
    if not _is_byte_level(tokenizer):
        return None
    chars = byte_level_chars()
    n_tok = len(tokenizer)
    names = tokenizer.convert_ids_to_tokens(list(range(min(n_tok, vocab_size))))
    single = tokenizer.batch_decode([[i] for i in range(min(n_tok, vocab_size))], skip_special_tokens=True,
                                    clean_up_tokenization_spaces=False)
    table: list[bytes] = []
    for name, text in zip(names, single):
        if not text or name is None:
            table.append(b"")
        elif all(c in chars for c in name):  # the ByteLevel decoder's rule: all mapped, else the raw UTF-8
            table.append(bytes(chars[c] for c in name))
        else:
            table.append(name.encode("utf-8"))
        if table[-1].decode("utf-8", errors="replace") != text:
            return None
    table.extend([b""] * (vocab_size - len(table)))  # ids past the tokenizer decode to nothing
    return table


class StopAutomaton:
    """Aho-Corasick automaton over the UTF-8 bytes of `stops`, with the per-token `code` table (see the
    module docstring) on `device`. Stop strings may be empty of stops: then it only flags eos ids."""

    def __init__(self, table: list[bytes], stops: tuple[str, ...], eos_ids, device):
        delta, accept = self._build([s.encode("utf-8") for s in stops])
        state, hit = self._per_token(table, delta, accept)
        is_eos = np.zeros(len(table), dtype=np.int64)
        is_eos[[e for e in eos_ids if 0 <= e < len(table)]] = 1
        code = state.astype(np.int64) * 4 + hit.astype(np.int64) * 2 + is_eos[None, :]
        self.n_states = delta.shape[0]
        self.code = torch.from_numpy(code).to(device)              # (Q, V) int64

    @classmethod
    def always(cls, vocab_size: int, eos_ids, device) -> "StopAutomaton":
        """Every token a stop candidate (the exact check then runs for every row, every step): for
        tokenizers whose decoding is not byte concatenation."""
        self = cls.__new__(cls)
        code = torch.full((1, vocab_size), 2, dtype=torch.long)
        code[0, [e for e in eos_ids if 0 <= e < vocab_size]] += 1
        self.n_states, self.code = 1, code.to(device)
        return self

    @staticmethod
    def _build(patterns: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Dense transitions (Q, 256) and accepting flags (Q,) of the automaton; state 0 is the root."""
        goto: list[dict[int, int]] = [{}]
        accept = [False]
        for p in patterns:
            q = 0
            for b in p:
                if b not in goto[q]:
                    goto.append({})
                    accept.append(False)
                    goto[q][b] = len(goto) - 1
                q = goto[q][b]
            accept[q] = True
        delta = np.zeros((len(goto), 256), dtype=np.int32)
        fail = [0] * len(goto)
        order = list(goto[0].values())                             # breadth-first: fail links are ready
        delta[0, list(goto[0])] = order
        for q in order:
            delta[q] = delta[fail[q]]
            for b, child in goto[q].items():
                delta[q, b] = child
                order.append(child)
            for b, child in goto[q].items():
                fail[child] = delta[fail[q], b] if q else 0
                accept[child] = accept[child] or accept[fail[child]]
        return delta, np.array(accept)

    @staticmethod
    def _per_token(table: list[bytes], delta: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From every state, every token's bytes read: (end state (Q, V), passed an accepting state (Q, V)).
        Vectorised over tokens by byte position, longest tokens first, so the work is Q x total bytes."""
        n_q, n_v = delta.shape[0], len(table)
        lens = np.fromiter((len(b) for b in table), dtype=np.int64, count=n_v)
        flat = np.frombuffer(b"".join(table), dtype=np.uint8)
        starts = np.cumsum(lens) - lens
        order = np.argsort(-lens, kind="stable")
        state = np.repeat(np.arange(n_q, dtype=np.int32)[:, None], n_v, axis=1)
        hit = np.zeros((n_q, n_v), dtype=bool)
        if n_q == 1:                                               # no stop strings: nothing to read
            return state, hit
        sorted_lens = lens[order]
        for j in range(int(lens.max(initial=0))):
            cols = order[: int(np.searchsorted(-sorted_lens, -j, side="left"))]   # tokens longer than j
            nxt = delta[state[:, cols], flat[starts[cols] + j][None, :]]
            state[:, cols] = nxt
            hit[:, cols] |= accept[nxt]
        return state, hit
