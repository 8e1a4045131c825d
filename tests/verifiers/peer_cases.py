"""Inputs for the peer checks (test_verifier_peers.py): responses built deterministically from the real
benchmark rows in ../shared/data, each labelled with the form it was built in.

Nothing here knows what our verifiers answer: the labels say how a response was *built* (an equivalent
rewrite, a perturbed value, "#### N" vs "The answer is N", ...); the verdicts come from the reference
implementations in the tests.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction

# ====================================================================== math (MATH-500 `answer` fields)
# Each rewrite maps an answer to a different string (None: does not apply to this answer). EQUIVALENT
# rewrites keep the value, WRONG ones change it; plain math-verify is the judge of both in the test.

_INT = r"-?\d+"
_FRAC = r"(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}"
_TUPLE = r"\((?:[^()]*,)+[^()]*\)"


def _full(pattern: str, s: str) -> re.Match[str] | None:
    return re.fullmatch(pattern, s.strip())


def int_decimal(a):  # 27 -> 27.0
    return f"{a}.0" if _full(_INT, a) else None


def int_thousands(a):  # 13535 -> 13,535
    return f"{int(a):,}" if _full(_INT, a) and abs(int(a)) >= 1000 else None


def int_latex_thousands(a):  # 13535 -> 13{,}535 (how MATH solutions write it)
    return f"{int(a):,}".replace(",", "{,}") if _full(_INT, a) and abs(int(a)) >= 1000 else None


def int_equation(a):  # 5 -> x = 5
    return f"x = {a}" if _full(_INT, a) else None


def int_text(a):  # 5 -> \text{5}
    return f"\\text{{{a}}}" if _full(_INT, a) else None


def frac_slash(a):  # \frac{14}{3} -> 14/3
    m = _full(_FRAC, a)
    return f"{m[1]}{m[2]}/{m[3]}" if m else None


def frac_dfrac(a):  # \frac{14}{3} -> \dfrac{14}{3}
    m = _full(_FRAC, a)
    return f"{m[1]}\\dfrac{{{m[2]}}}{{{m[3]}}}" if m else None


def frac_decimal(a):  # \frac{3}{8} -> 0.375 (only where the decimal is exact)
    m = _full(_FRAC, a)
    if not m:
        return None
    q = Fraction(int(m[2]), int(m[3])) * (-1 if m[1] else 1)
    d = q.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return format(q.numerator / q.denominator, ".10g") if d == 1 else None


def frac_sign_inside(a):  # -\frac{3}{8} -> \frac{-3}{8}
    m = _full(_FRAC, a)
    return f"\\frac{{-{m[2]}}}{{{m[3]}}}" if m and m[1] else None


def frac_unreduced(a):  # \frac{3}{8} -> \frac{6}{16}
    m = _full(_FRAC, a)
    return f"{m[1]}\\frac{{{2 * int(m[2])}}}{{{2 * int(m[3])}}}" if m else None


def decimal_fraction(a):  # 1.25 -> \frac{5}{4}
    if not _full(r"-?\d*\.\d+", a):
        return None
    q = Fraction(a)
    return f"\\frac{{{q.numerator}}}{{{q.denominator}}}"


def sqrt_fold(a):  # 3\sqrt{13} -> \sqrt{117}
    m = _full(r"(\d+)\s*\\sqrt\{?(\d+)\}?", a)
    return f"\\sqrt{{{int(m[1]) ** 2 * int(m[2])}}}" if m else None


def degrees_braced(a):  # 90^\circ -> 90^{\circ}
    m = _full(r"(\d+)\^\\circ", a)
    return f"{m[1]}^{{\\circ}}" if m else None


def degrees_dropped(a):  # 90^\circ -> 90
    m = _full(r"(\d+)\^\\circ", a)
    return m[1] if m else None


def text_unwrapped(a):  # \text{Evelyn} -> Evelyn
    m = _full(r"\\(?:text|mbox)\{\s*([^{}]*?)\s*\}", a)
    return m[1] if m else None


def dollars_dropped(a):  # \$18.90 -> 18.90
    m = _full(r"\\\$\s*(.+)", a)
    return m[1] if m else None


def equation_dropped(a):  # x=5 -> 5
    m = _full(r"[a-z]\s*=\s*([^=<>]+)", a)
    return m[1] if m else None


def tuple_spacing(a):  # (6,31,-1) -> \left( 6, 31, -1 \right)
    if _full(_TUPLE, a) and "\\infty" not in a:
        return "\\left( " + ", ".join(p.strip() for p in a[1:-1].split(",")) + " \\right)"
    return None


def interval_spacing(a):  # (-\infty, 0] -> \left( -\infty , 0 \right]
    if _full(r"[(\[][^()\[\]]*,[^()\[\]]*[)\]]", a) and "\\infty" in a:
        return "\\left" + a[0] + " " + a[1:-1].replace(",", " , ") + " \\right" + a[-1]
    return None


def list_reversed(a):  # "1,-2" (all solutions, a set) -> "-2, 1"; not "58,500" (a thousands separator)
    if _full(r"-?\d+(?:\s*,\s*-?\d+)+", a) and not _full(r"-?\d{1,3}(?:,\d{3})+", a):
        return ", ".join(reversed([p.strip() for p in a.split(",")]))
    return None


def complex_reordered(a):  # 6 - 5i -> -5i + 6
    m = _full(r"(-?\d+)\s*([+-])\s*(\d*)i", a)
    return f"{'-' if m[2] == '-' else ''}{m[3]}i + {m[1]}" if m else None


def pi_slash(a):  # -\frac{\pi}{6} -> -\pi/6
    m = _full(r"(-?)\\frac\{(\d*)\\pi\}\{(\d+)\}", a)
    return f"{m[1]}{m[2]}\\pi/{m[3]}" if m else None


def mixed_number(a):  # 1\frac{4}{5} -> \frac{9}{5}
    m = _full(r"(\d+)\s*\\frac\{?(\d)\}?\{?(\d+)\}?", a)
    if not m:
        return None
    q = int(m[1]) + Fraction(int(m[2]), int(m[3]))
    return f"\\frac{{{q.numerator}}}{{{q.denominator}}}"


def poly_reversed(a):  # x^3+3x-6 -> -6 +3x +x^3
    if not re.search(r"[a-z]", a) or re.search(r"[\\(){}=,]", a):
        return None
    terms = [t.replace(" ", "") for t in re.findall(r"[+-]?\s*[^+-]+", a)]
    if len(terms) < 2:
        return None
    return " ".join(t if t[0] in "+-" else "+" + t for t in reversed(terms)).lstrip("+")


def pmatrix_bmatrix(a):
    return a.replace("pmatrix", "bmatrix") if "pmatrix" in a else None


MATH_EQUIVALENT = [
    int_decimal, int_thousands, int_latex_thousands, int_equation, int_text, frac_slash, frac_dfrac,
    frac_decimal, frac_sign_inside, frac_unreduced, decimal_fraction, sqrt_fold, degrees_braced,
    degrees_dropped, text_unwrapped, dollars_dropped, equation_dropped, tuple_spacing, interval_spacing,
    list_reversed, complex_reordered, pi_slash, mixed_number, poly_reversed, pmatrix_bmatrix,
]


def last_int_plus_one(a):  # \frac{3}{8} -> \frac{3}{9}; 52_8 -> 52_9 (math-verify ignores bases: see test)
    ms = list(re.finditer(r"\d+", a))
    if not ms:
        return None
    m = ms[-1]
    return a[:m.start()] + str(int(m[0]) + 1) + a[m.end():]


def negated(a):
    return str(-int(a)) if _full(_INT, a) and int(a) != 0 else None


def times_ten(a):
    return str(10 * int(a)) if _full(_INT, a) and int(a) != 0 else None


def frac_flipped(a):  # \frac{3}{8} -> \frac{8}{3}
    m = _full(_FRAC, a)
    return f"{m[1]}\\frac{{{m[3]}}}{{{m[2]}}}" if m and m[2] != m[3] else None


def tuple_reversed(a):  # an ordered tuple in another order
    if _full(_TUPLE, a) and "\\infty" not in a:
        parts = [p.strip() for p in a[1:-1].split(",")]
        if parts != parts[::-1]:
            return "(" + ", ".join(reversed(parts)) + ")"
    return None


def brackets_closed(a):  # (2,4) -> [2,4]
    if _full(r"\([^()\[\]]*,[^()\[\]]*\)", a) and "\\infty" not in a and "\\cup" not in a:
        return "[" + a[1:-1] + "]"
    return None


MATH_WRONG = [last_int_plus_one, negated, times_ten, frac_flipped, tuple_reversed, brackets_closed]

# How the rewritten answer is embedded in a response; cycled over the pairs.
MATH_TEMPLATES = [
    "Putting it together, the final answer is $\\boxed{{{x}}}$.",
    "Final Answer: The final answer is ${x}$. I hope it is correct.",
    "We simplify step by step.\n\nThe answer is \\boxed{{{x}}}",
    "Therefore we obtain $ {x} $.",
]

# Hand-written (answer as the response writes it, gold) pairs for forms the data has too few of.
MATH_HAND_EQUIVALENT = [
    ("2\\sqrt{3}", "\\sqrt{12}"), ("\\sqrt{12}", "2\\sqrt{3}"), ("\\sqrt{50}", "5\\sqrt2"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("\\frac12", "0.5"), ("\\tfrac{3}{4}", "0.75"),
    ("\\dfrac{7}{2}", "3.5"), ("1/3", "\\frac{1}{3}"), ("\\frac{-1}{2}", "-\\frac12"),
    ("\\{2, 1\\}", "\\{1,2\\}"), ("\\{3,1,2\\}", "\\{1, 2, 3\\}"), ("3, 1", "1,3"),
    ("[1, 3)", "[1,3)"), ("\\left(-\\infty,3\\right]", "(-\\infty, 3]"), ("(0,1)\\cup(2,3)", "(0, 1) \\cup (2, 3)"),
    ("90^{\\circ}", "90^\\circ"), ("45", "45^\\circ"), ("\\text{(C)}", "\\text{(C)}"), ("\\textbf{Navin}", "\\text{Navin}"),
    ("10{,}000", "10000"), ("10,000", "10000"), ("1,000,000", "10^6"), ("x = 5", "5"), ("5", "x=5"),
    ("y = 2x + 3", "y=2x+3"), ("\\$36", "36"), ("\\frac{\\pi}{2}", "\\pi/2"), ("2\\pi", "\\pi \\cdot 2"),
    ("0.15", "\\frac{3}{20}"), ("15\\%", "15"), ("(x+1)^2", "x^2+2x+1"), ("3 + 2\\sqrt{2}", "2\\sqrt{2} + 3"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"), ("e^{0}", "1"),
]
MATH_HAND_WRONG = [
    ("\\sqrt{13}", "2\\sqrt{3}"), ("(2,1)", "(1,2)"), ("[1,3]", "[1,3)"), ("0.33", "\\frac{1}{3}"),
    ("\\frac{2}{3}", "\\frac{3}{2}"), ("91^\\circ", "90^\\circ"), ("10{,}001", "10000"), ("x=6", "5"),
    ("2x+4", "2x+3"), ("-\\frac{\\pi}{2}", "\\frac{\\pi}{2}"), ("\\{1,2,3\\}", "\\{1,2\\}"), ("\\text{Evelyn}", "\\text{Navin}"),
    ("(-\\infty, 3)", "(-\\infty, 3]"), ("6 + 5i", "6 - 5i"), ("x^2-1", "(x+1)^2"),
]


def math_pairs(answers: list[str]) -> list[tuple[str, str, str, str]]:
    """(intended, form, response, gold): every rewrite that applies to every answer, then the hand-written
    pairs; intended is "equivalent" or "wrong"."""
    pairs = []
    for i, a in enumerate(answers):
        for intended, rewrites in (("equivalent", MATH_EQUIVALENT), ("wrong", MATH_WRONG)):
            for j, rewrite in enumerate(rewrites):
                x = rewrite(a)
                if x is None or x.strip() == a.strip():
                    continue
                pairs.append((intended, rewrite.__name__, MATH_TEMPLATES[(i + j) % len(MATH_TEMPLATES)].format(x=x), a))
    for intended, hand in (("equivalent", MATH_HAND_EQUIVALENT), ("wrong", MATH_HAND_WRONG)):
        for k, (x, gold) in enumerate(hand):
            pairs.append((intended, "hand", MATH_TEMPLATES[k % len(MATH_TEMPLATES)].format(x=x), gold))
    pairs += [("no answer", "hand", "I could not solve this problem.", "5"), ("no answer", "hand", "", "\\frac{1}{2}")]
    return pairs


# ====================================================================== gsm8k (test split `answer` fields)

def gsm8k_responses(gold_solution: str) -> dict[str, str]:
    """Responses for one GSM8K row, by form. `gold_solution` is the row's answer text ending in "#### N"."""
    reasoning, final = gold_solution.rsplit("####", 1)
    n = int(final.strip().replace(",", ""))
    clean = re.sub(r"<<[^>]*>>", "", reasoning).strip()  # without the calculator annotations
    money = f"-${-n:,}" if n < 0 else f"${n:,}"
    return {
        # right answers
        "gold_solution": gold_solution,
        "hash": f"{clean}\n#### {n}",
        "hash_commas": f"{clean}\n#### {n:,}",
        "hash_period": f"{clean}\n#### {n:,}.",
        "hash_dollar": f"{clean}\n#### {money}",
        "hash_decimal": f"{clean}\n#### {n}.00",
        "answer_is": f"{clean}\nThe answer is {n}.",
        "answer_is_dollar": f"{clean}\nSo the answer is {money}.",
        "answer_is_ellipsis": f"{clean}\nSo the answer is {n}...",
        "phrased": f"{clean}\nAltogether that makes {n:,} in total.",
        "phrased_comma": f"{clean}\nThe result is {n}, as computed above",
        "bare_number": str(n),
        "two_markers_last_right": f"{clean}\n#### {n + 1}\nWait, I made a mistake, let me recheck.\n#### {n}",
        "continued_after_answer": f"{clean}\n#### {n}\n\nQuestion: Tom has 3 cats and 4 dogs. How many pets?\nAnswer: 3 + 4 = 7",
        "number_after_answer": f"{clean}\n#### {n}\nThat is {n + 2} more than last week.",
        # wrong answers and no answer
        "wrong_hash": f"{clean}\n#### {n + 1}",
        "wrong_negated": f"{clean}\n#### {-n if n else 5}",
        "wrong_answer_is": f"{clean}\nThe answer is {n + 7}.",
        "wrong_phrased": f"{clean}\nSo she ends up with {n + 10} after all.",
        "no_number": "I am not sure how to solve this problem.",
    }


# ====================================================================== ifeval (prompts only)

def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s] or [text]


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]+", text) or ["word"]


def _n_words(text: str, n: int) -> str:  # exactly n \w+ words, cycling through the prompt's words
    w = _words(text)
    return " ".join(w[i % len(w)] for i in range(n))


def _n_sentences(text: str, n: int) -> str:  # n plain sentences of six of the prompt's words each
    w = _words(text)
    return " ".join(" ".join(w[(6 * i + j) % len(w)] for j in range(6)).capitalize() + "." for i in range(n))


def _cycle(items: list[str], n: int) -> list[str]:
    return [items[i % len(items)] for i in range(n)]


def _drop(text: str, word: str) -> str:
    return re.sub(re.escape(word), "", text, flags=re.IGNORECASE)


def ifeval_generic(p: str) -> dict[str, str]:
    """The prompt rewritten in forms that follow or break most instructions, whatever the row asks."""
    s = _sentences(p)
    return {
        "identity": p,
        "upper": p.upper(),
        "lower": p.lower(),
        "no_commas": p.replace(",", ""),
        "quoted": f'"{p}"',
        "titled": f"<<{' '.join(_words(p)[:4])}>>\n\n{p}",
        "stars_paragraphs": "\n\n***\n\n".join(s),
        "blank_line_paragraphs": "\n\n".join(s),
        "postscript": f"{p}\n\nP.S. I hope this helps.",
        "json": "```json\n" + json.dumps({"response": p}) + "\n```",
        "star_bullets": "\n".join(f"* {x}" for x in s),
        "dash_bullets": "\n".join(f"- {x}" for x in s),
        "highlighted": " ".join(f"*{x}*" for x in s),
        "sections": "\n\n".join(f"SECTION {i + 1}\n{x}" for i, x in enumerate(s)),
        "two_responses": f"{p}\n******\n{p.lower()}",
        "doubled": f"{p} {p}",
        "first_sentence": s[0],
        "shouting_contractions": f"{p} I DON'T KNOW, IT'S HARD AND I CAN'T SAY.",
        "abbreviations": f"{p} Dr. Smith met Mr. J. Jones at 5 p.m. in the U.S. on Jan. 3 to discuss it. They agreed, i.e. they signed.",
        "framed_by_lines": f"Sure, here is my answer:\n{p}\nLet me know if you need more.",
    }


def ifeval_targeted(p: str, iid: str, kw: dict) -> tuple[str, str]:
    """(meant to follow, meant to violate) one instruction with its kwargs, built from the prompt."""
    def by_relation(more: str, fewer: str, relation: str) -> tuple[str, str]:
        return (more, fewer) if relation == "at least" else (fewer, more)

    s = _sentences(p)
    if iid == "change_case:capital_word_frequency":
        c = kw["capital_frequency"]
        return by_relation(p.lower() + " NOTE" * c, p.lower() + " NOTE" * (c - 1), kw["capital_relation"])
    if iid == "change_case:english_capital":
        return p.upper(), p
    if iid == "change_case:english_lowercase":
        return p.lower(), p
    if iid == "combination:repeat_prompt":
        q = kw["prompt_to_repeat"]
        return f"{q}\nHere is my answer.", f"Sure. {q}"
    if iid == "combination:two_responses":
        return f"{p}\n******\n{p.upper()}", f"{p}\n******\n{p}"
    if iid == "detectable_content:number_placeholders":
        n = kw["num_placeholders"]
        return p + "".join(f" [field {i}]" for i in range(n)), p + "".join(f" [field {i}]" for i in range(n - 1))
    if iid == "detectable_content:postscript":
        marker = kw["postscript_marker"]
        return f"{p}\n\n{marker} Thanks.", f"{_drop(p, marker)}\n\nThanks."
    if iid == "detectable_format:constrained_response":
        return "My answer is maybe.", p.lower()
    if iid == "detectable_format:json_format":
        return json.dumps({"answer": p}), "{" + p
    if iid == "detectable_format:multiple_sections":
        spl, n = kw["section_spliter"], kw["num_sections"]
        sections = lambda m: "\n\n".join(f"{spl} {i + 1}\n{x}" for i, x in enumerate(_cycle(s, m)))  # noqa: E731
        return sections(n), sections(n - 1)
    if iid == "detectable_format:number_bullet_lists":
        n = kw["num_bullets"]
        return "\n".join(f"* {x}" for x in _cycle(_words(p), n)), "\n".join(f"* {x}" for x in _cycle(_words(p), n + 1))
    if iid == "detectable_format:number_highlighted_sections":
        n, base = kw["num_highlights"], p.replace("*", "")
        return base + "".join(f" *part {i}*" for i in range(n)), base + "".join(f" *part {i}*" for i in range(n - 1))
    if iid == "detectable_format:title":
        return f"<<{_words(p)[0]}>>\n{p}", p.replace("<<", "").replace(">>", "")
    if iid == "keywords:existence":
        base = p
        for k in kw["keywords"]:
            base = _drop(base, k)
        return base + " " + " ".join(kw["keywords"]), base
    if iid == "keywords:forbidden_words":
        base = p
        for k in kw["forbidden_words"]:
            base = re.sub(r"\b" + re.escape(k) + r"\b", "", base, flags=re.IGNORECASE)
        return base, f"{base} {kw['forbidden_words'][0]}"
    if iid == "keywords:frequency":
        k, f, base = kw["keyword"], kw["frequency"], _drop(p, kw["keyword"])
        return by_relation(base + f" {k}" * f, base + f" {k}" * (f - 1), kw["relation"])
    if iid == "keywords:letter_frequency":
        letter, f = kw["letter"], kw["let_frequency"]
        base = _drop(p, letter)
        return by_relation(f"{base} {letter * f}", f"{base} {letter * (f - 1)}", kw["let_relation"])
    if iid == "language:response_language":
        # We cannot write in the 22 target languages from an English prompt; digits only are text
        # langdetect cannot classify, which both implementations count as following.
        return "1234 5678 90", p
    if iid == "length_constraints:nth_paragraph_first_word":
        n, nth, first = kw["num_paragraphs"], kw["nth_paragraph"], kw["first_word"]
        good, bad = _cycle(s, n), _cycle(s, n)
        good[nth - 1] = f"{first.capitalize()} {good[nth - 1]}"
        bad[nth - 1] = f"Otherwise {bad[nth - 1]}"
        return "\n\n".join(good), "\n\n".join(bad)
    if iid == "length_constraints:number_paragraphs":
        n = kw["num_paragraphs"]
        return "\n***\n".join(_cycle(s, n)), "\n***\n".join(_cycle(s, n + 1))
    if iid == "length_constraints:number_sentences":
        n = kw["num_sentences"]
        return by_relation(_n_sentences(p, n), _n_sentences(p, n - 1), kw["relation"])
    if iid == "length_constraints:number_words":
        n = kw["num_words"]
        return by_relation(_n_words(p, n), _n_words(p, n - 1), kw["relation"])
    if iid == "punctuation:no_comma":
        return p.replace(",", ""), f"{p}, indeed"
    if iid == "startend:end_checker":
        e = kw["end_phrase"]
        return f"{p}\n{e}", f"{e}\n{p}"
    if iid == "startend:quotation":
        return f'"{p}"', p.replace('"', "")
    raise KeyError(f"no targeted responses for {iid}")


def ifeval_responses(row: dict) -> dict[str, str]:
    out = ifeval_generic(row["prompt"])
    for iid, kw in zip(row["instruction_id_list"], row["kwargs"]):
        out[f"follow {iid}"], out[f"violate {iid}"] = ifeval_targeted(row["prompt"], iid, kw)
    return out


# ====================================================================== ifeval: sentence and word counting
# Responses where a sentence or a capital word is easy to miscount: lower-case sentences, bullets, numbered
# lines, paragraphs, initials ("J. R. R. Tolkien"), a one-letter word before the final period ("in o."),
# abbreviations, decimals, ellipses, quotes, shouted contractions. Each style writes its i-th sentence from the
# prompt's words; a response is n such sentences (n as a person would count them; the reference decides).

def _phrase(words: list[str], i: int, n: int = 5) -> str:
    return " ".join(words[(n * i + j) % len(words)] for j in range(n)).lower()


_ABBREVIATED = [
    "Dr. Smith said {p}, etc.", "{P}, e.g. in the U.S. at 5 p.m.", "Mr. Jones and Mrs. Lee saw {p}, i.e. Fig. 3.",
    "{P} at No. 5 St. James St.", "Prof. Lee vs. Gen. Grant on {p}.",
]
_SPELLED = {  # style -> (the i-th sentence, the text between sentences i and i + 1)
    "lowercase": (lambda p, i: f"{p}.", lambda i: " "),
    "star_bullets": (lambda p, i: f"* {p.capitalize()}.", lambda i: "\n"),
    "dash_bullets": (lambda p, i: f"- {p}.", lambda i: "\n"),
    "numbered": (lambda p, i: f"{i + 1}. {p.capitalize()}.", lambda i: "\n"),
    "paragraphs": (lambda p, i: f"{p.capitalize()}.", lambda i: "\n\n" if i % 2 else " "),
    "initials": (lambda p, i: f"J. R. R. Tolkien wrote {p}." if i % 2 else f"{p.capitalize()} by J. R. R. Tolkien.",
                 lambda i: " "),
    "one_letter_end": (lambda p, i: f"Let's say {p} is located in o.", lambda i: " "),
    "abbreviations": (lambda p, i: _ABBREVIATED[i % len(_ABBREVIATED)].format(p=p, P=p.capitalize()), lambda i: " "),
    "decimals": (lambda p, i: f"{p.capitalize()} costs 3.5 dollars, up 0.25 from version 2.0.", lambda i: " "),
    "ellipses": (lambda p, i: f"Wait... {p}?" if i % 2 else f"{p.capitalize()}... and more…", lambda i: " "),
    "quotes": (lambda p, i: f'"{p.capitalize()}," she said.' if i % 2 else f"He wrote \"{p}.\"", lambda i: " "),
    "shouting": (lambda p, i: f"{p.upper()} DON'T STOP, IT'S THE U.S. A.M. RULE!", lambda i: " "),
}
SENTENCE_STYLES = sorted(_SPELLED)
_CAPITAL_TOKENS = ["DON'T", "U.S.", "IT'S", "WELL-KNOWN", "P.S.", "CAN'T", "A.M.", "O'NEIL", "NASA's", "I"]


def stress_text(prompt: str, style: str, n: int) -> str:
    """n sentences in one style ("mixed": every style in turn), from the prompt's words."""
    words, out = _words(prompt), []
    for i in range(n):
        name = SENTENCE_STYLES[i % len(SENTENCE_STYLES)] if style == "mixed" else style
        sentence, gap = _SPELLED[name]
        out.append(sentence(_phrase(words, i), i) + (gap(i) if i < n - 1 else ""))
    return "".join(out)


def ifeval_counting_responses(index: int, row: dict) -> dict[str, str]:
    """Counting-stress responses for one row: every row a mixed text and one style (in turn); rows that ask for
    a number of sentences each style at the asked number and one off either way; rows that ask for capital
    words shouted tokens around the asked number."""
    p, kw = row["prompt"], dict(zip(row["instruction_id_list"], row["kwargs"]))
    style = SENTENCE_STYLES[index % len(SENTENCE_STYLES)]
    out = {"mixed 6": stress_text(p, "mixed", 6), f"{style} 4": stress_text(p, style, 4)}
    if "length_constraints:number_sentences" in kw:
        n = kw["length_constraints:number_sentences"]["num_sentences"]
        for style in ["mixed", *SENTENCE_STYLES]:
            for k in {max(1, n - 1), n, n + 1}:
                out[f"{style} {k}"] = stress_text(p, style, k)
    if "change_case:capital_word_frequency" in kw:
        c = kw["change_case:capital_word_frequency"]["capital_frequency"]
        for style in SENTENCE_STYLES:
            out[f"{style} 4"] = stress_text(p, style, 4)
        for k in {max(0, c - 1), c, c + 1}:
            out[f"capital_tokens {k}"] = p.lower() + "".join(" " + t for t in _cycle(_CAPITAL_TOKENS, k))
    return out
