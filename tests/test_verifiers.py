import subprocess
import sys

import pytest

from sleuth.tasks import Task
from sleuth.verifiers import QAVerifier, exact_match, normalize_answer, support_recall, token_f1
from sleuth.verifiers.qa import answer_in_text


@pytest.mark.parametrize(
    "pred, gold, em, f1",
    [
        ("The Eiffel Tower", "Eiffel Tower", 1.0, 1.0),  # article dropped
        ("eiffel tower!", "Eiffel Tower.", 1.0, 1.0),  # case and punctuation
        ("Denise Levertov, poet", "Denise Levertov", 0.0, 0.8),  # P = 2/3, R = 1 -> 0.8
        ("Levertov", "Denise Levertov", 0.0, 2 / 3),  # P = 1, R = 1/2 -> 2/3
        ("yes", "yes", 1.0, 1.0),
        ("yes", "no", 0.0, 0.0),
        ("no it is not", "no", 0.0, 0.0),  # yes/no answers only count when exact (official script)
        ("Harvey", "yes", 0.0, 0.0),
        ("", "Paris", 0.0, 0.0),
        ("an apple a day", "apple day", 1.0, 1.0),
    ],
)
def test_em_f1_against_hand_computed_values(pred, gold, em, f1):
    assert exact_match(pred, gold) == em
    assert token_f1(pred, gold) == pytest.approx(f1)


def test_normalisation_matches_official_rules():
    assert normalize_answer("  The  Quick, brown fox's  ") == "quick brown foxs"
    assert normalize_answer("A") == ""


@pytest.mark.parametrize(
    "text, answers, held",
    [
        ("Priscilla Denise Levertov (1923) was an American poet.", ["Denise Levertov"], True),
        ("THE EIFFEL-TOWER, in Paris", ["Eiffel Tower"], False),  # "eiffeltower": punctuation joins the words
        ("the Eiffel Tower, in Paris", ["The Eiffel Tower"], True),  # articles, case, punctuation as in EM
        ("a Parisian café", ["Paris"], False),  # whole tokens only
        ("born in the USA", ["United States", "USA"], True),  # any accepted answer
        ("yes, no and no answer", ["yes"], None),  # yes / no is never a span
        ("anything", ["no", ""], None),
    ],
)
def test_answer_in_text_matches_whole_normalised_tokens(text, answers, held):
    assert answer_in_text(text, answers) is held


def test_verifier_takes_best_alias_and_reports_recall():
    task = Task(id="1", question="q", answer="United States", aliases=["USA", "America"],
                payload={"supporting": ["A", "B"]})
    v = QAVerifier()(task, "usa", evidence=["A", "C", "A"])
    assert v.score == 1.0 and v.details["em"] == 1.0 and v.details["support_recall"] == 0.5
    assert QAVerifier("em")(task, "the united states of", evidence=None).score == 0.0
    assert "support_recall" not in QAVerifier()(task, "x").details
    assert support_recall([], []) == 1.0
    with pytest.raises(ValueError):
        QAVerifier("bleu")


def test_verifiers_import_without_torch():
    code = ("import sys, sleuth.verifiers, sleuth.verifiers.code, sleuth.verifiers.batch; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_extractors_are_read_from_their_registry():
    """Which part of a reply a verifier scores is `EXTRACTORS`' entry of its name; no entry: the whole reply."""
    from sleuth.verifiers.registry import EXTRACTORS, extractor

    assert {"qa", "code", "swe"} <= set(EXTRACTORS.names())
    assert extractor("qa") is EXTRACTORS.get("qa") and extractor("qa")("Answer: Paris") == "Paris"
    EXTRACTORS.register("_answer_only", "sleuth.verifiers.extract:extract_answer")
    try:
        assert extractor("_answer_only")("Answer: Paris") == "Paris"
        assert extractor("_no_extractor")("Answer: Paris") == "Answer: Paris"
    finally:
        EXTRACTORS.unregister("_answer_only")
