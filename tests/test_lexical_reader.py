"""The lexical reader: a no-model floor for DocRead reading, and the demonstrator built on it."""

import json

from sleuth.agents.eval.episodes import load_trajectories
from sleuth.agents.policies.scripted import lexical_plan
from sleuth.cli.main import main
from sleuth.tasks.qa import Document

DOCS = [
    Document("Zebra", "Zebras are striped."),
    Document("Ada Lovelace", "Ada Lovelace worked with Charles Babbage on the Analytical Engine."),
    Document("Analytical Engine", "A mechanical general-purpose computer."),
    Document("Lovelace (crater)", "A crater on the Moon."),
    Document("Charles Babbage", "An English mathematician."),
]


def test_plan_reads_the_named_title_then_the_bridge_then_word_overlap():
    """Hand-scored: Ada Lovelace is named whole in the question (100 + 10·2/2); after reading it, Analytical
    Engine is named whole in its text (50 + 10·1/2 for "engine" + 5·2/2 = 60) and beats Charles Babbage
    (50 + 5·2/2 = 55); then Charles Babbage (55) beats Lovelace (crater) (10·1/2 + 5·1/2 = 7.5)."""
    question = "Which engine did Ada Lovelace write about?"
    assert lexical_plan(question, DOCS, 3) == [1, 2, 4]
    assert lexical_plan(question, DOCS, 1) == [1]
    assert lexical_plan(question, DOCS, 9) == [1, 2, 4, 3, 0]  # never more reads than documents, none twice


def test_plan_uses_only_what_was_read_and_breaks_ties_by_list_order():
    """No title matches the question: all score 0 and the first document is read; its text names nothing,
    so the tie goes on to the next in list order; a duplicate title is not read twice."""
    docs = [Document("B", "nothing"), Document("B", "again"), Document("C", "x")]
    assert lexical_plan("Who?", docs, 3) == [0, 2]


def test_lexical_baseline_and_demonstrator_on_test_questions(tmp_path):
    """On 12 test questions both read the same three titles by name; the demonstrator answers the gold (F1 1),
    the baseline a read title; their support recall is the plan's, well above random reading's 0.31."""
    for policy in ("lexical", "oracle-lexical"):
        out = tmp_path / policy
        assert main(["eval", "--env", "sleuth/DocRead-v0", "--tasks", "hotpotqa:test", "--limit", "12",
                     "--policy", policy, "--harness", "text", "--out", str(out)]) == 0
    base = load_trajectories(tmp_path / "lexical" / "trajectories.jsonl")
    demo = load_trajectories(tmp_path / "oracle-lexical" / "trajectories.jsonl")
    reads = {t.task_id: [turn.action_text for turn in t.turns[:3]] for t in base}
    assert reads == {t.task_id: [turn.action_text for turn in t.turns[:3]] for t in demo}
    assert all(r.startswith("read ") and not r[5:].isdigit() for rs in reads.values() for r in rs)
    summary = json.loads((tmp_path / "oracle-lexical" / "summary.json").read_text())
    assert summary["f1"] == 1.0 and summary["mean_reads"] == 3.0 and summary["tool_error_rate_turns"] == 0.0
    baseline = json.loads((tmp_path / "lexical" / "summary.json").read_text())
    assert baseline["support_recall"] == summary["support_recall"] > 0.6
