from dataclasses import replace

import gymnasium
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sleuth
from sleuth.envs import DocReadEnv, ToolEnv, tool
from sleuth.envs.outcome import reset_info, step_info
from sleuth.tasks import Task


def call(name, **args):
    import json

    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


@pytest.fixture
def env(hotpot_tasks):
    e = sleuth.make("DocRead-v0", harness="json", budget=3)
    e.reset(options={"task": hotpot_tasks[0]})
    return e


def test_both_registries_build_the_same_env(hotpot_tasks):
    a = gymnasium.make("sleuth/DocRead-v0", budget=2)
    b = sleuth.make("DocRead-v0", budget=2)
    assert type(a.unwrapped) is type(b.unwrapped) is DocReadEnv
    assert "sleuth/DocRead-v0" in sleuth.registered()
    with pytest.raises(gymnasium.error.NameNotFound, match="known: .*sleuth/DocRead-v0"):
        sleuth.make("Nope-v9")


def test_reset_info_carries_messages_and_tool_schemas(hotpot_tasks):
    env = sleuth.make("DocRead-v0")
    obs, info = env.reset(options={"task": hotpot_tasks[0]})
    assert obs.startswith("Question: Between Harvey Pekar") and "[7] Harvey Pekar" in obs
    assert [m["role"] for m in reset_info(info).messages] == ["system", "user"]
    assert {s["function"]["name"] for s in reset_info(info).tools} == {"read", "answer"}
    assert reset_info(info).format == "json" and reset_info(info).budget == 3
    assert env.observation_space.contains(obs)


def test_reads_are_recorded_with_gold_and_reread(env):
    obs, r, term, trunc, info = env.step(call("read", doc=7))
    assert obs.startswith("[7] Harvey Pekar\nHarvey Lawrence Pekar") and "(2 reads left)" in obs
    assert step_info(info).read == {"turn": 1, "doc": 7, "title": "Harvey Pekar", "gold": True, "reread": False,
                            "answer": False}
    assert step_info(info).messages == [{"role": "tool", "content": obs}]
    _, _, _, _, info = env.step(call("read", doc="Harvey Pekar"))  # by title, a re-read
    assert step_info(info).read["reread"] and step_info(info).read["doc"] == 7
    _, _, _, _, info = env.step(call("read", doc=0))
    assert step_info(info).read["gold"] is False


def test_a_read_says_whether_its_document_holds_the_answer(env, hotpot_tasks):
    assert env.unwrapped.task.answer == "Denise Levertov"
    _, _, _, _, info = env.step(call("read", doc=4))  # "Priscilla Denise Levertov (...) was an American poet."
    assert step_info(info).read["answer"] is True and step_info(info).read["gold"] is True
    yes_no = next(t for t in hotpot_tasks if t.answer in ("yes", "no"))
    env.reset(options={"task": yes_no})
    _, _, _, _, info = env.step(call("read", doc=0))
    assert step_info(info).read["answer"] is None  # a yes/no answer is never a span of a document


def test_answer_scores_f1_and_support_recall(env):
    env.step(call("read", doc=4))
    obs, reward, term, trunc, info = env.step(call("answer", text="Levertov"))
    assert term and not trunc and reward == pytest.approx(2 / 3)
    assert step_info(info).verdict.details == {"em": 0.0, "f1": pytest.approx(2 / 3), "prediction": "Levertov",
                                          "support_recall": 0.5}
    with pytest.raises(RuntimeError, match="reset"):
        env.step(call("answer", text="x"))


@pytest.mark.parametrize(
    "action, message",
    [
        (call("read", doc=99), "no document [99]: choose a number from 0 to 9"),
        (call("read", doc=[1]), "argument 'doc' of tool 'read' must be"),
        (call("read"), "missing argument(s) ['doc']"),
        (call("read", doc=1, page=2), "unknown argument(s) ['page']"),
        (call("search", query="x"), "unknown tool 'search'; available tools: read, answer"),
        ("<tool_call>{oops</tool_call>", "not valid JSON"),
        ("just text", "no tool call found"),
        (call("read", doc="No Such Title"), "no document titled 'No Such Title'"),
    ],
)
def test_malformed_actions_are_observations_not_exceptions(env, action, message):
    obs, reward, term, trunc, info = env.step(action)
    assert message in obs and message in step_info(info).error
    assert (reward, term, trunc) == (0.0, False, False) and "(2 reads left)" in obs


def test_errors_use_the_budget_then_one_last_turn_then_truncation(env):
    for left in (2, 1, 0):
        obs, *_ = env.step("no call")
        assert f"({left} reads left)" in obs or left == 0
    assert "no reads left: call answer now" in obs
    obs, reward, term, trunc, info = env.step(call("read", doc=1))
    assert trunc and not term and reward == 0.0 and step_info(info).verdict.score == 0.0
    assert step_info(info).messages == []


def test_non_string_action_is_reported(env):
    obs, *_ , info = env.step(42)
    assert "must be text" in step_info(info).error


def test_reset_samples_from_tasks_and_rejects_missing(hotpot_tasks):
    env = DocReadEnv(tasks=hotpot_tasks[:5])
    _, info = env.reset(seed=3)
    assert info["task_id"] in {t.id for t in hotpot_tasks[:5]}
    with pytest.raises(ValueError, match="options"):
        DocReadEnv().reset()
    with pytest.raises(ValueError, match="no payload"):
        DocReadEnv().reset(options={"task": Task(id="x", question="q")})


def test_env_without_final_tool_or_verifier_is_rejected():
    class NoFinal(ToolEnv):
        @tool
        def ping(self) -> str:
            """Ping."""
            return "pong"

    with pytest.raises(TypeError, match="final"):
        NoFinal(verifier=lambda t, r: None)

    class NoVerifier(ToolEnv):
        @tool(final=True)
        def done(self) -> str:
            """Done."""
            return ""

    with pytest.raises(TypeError, match="verifier"):
        NoVerifier()


def test_a_crashing_tool_becomes_an_observation():
    class Buggy(ToolEnv):
        @tool
        def boom(self) -> str:
            """Fails."""
            return str(1 / 0)

        @tool(final=True)
        def done(self) -> str:
            """Done."""
            return ""

    env = Buggy(verifier=lambda t, r: sleuth.Verdict(0.0))
    env.reset(options={"task": Task(id="x", question="q")})
    obs, *_, info = env.step(call("boom"))
    assert "tool 'boom' failed: ZeroDivisionError" in step_info(info).error


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=200), min_size=1, max_size=6), st.sampled_from(["json", "text"]))
def test_env_step_never_raises_on_arbitrary_text(hotpot_tasks, actions, harness):
    env = DocReadEnv(harness=harness, budget=3)
    env.reset(options={"task": hotpot_tasks[1]})
    for a in actions:
        obs, reward, term, trunc, info = env.step(a)
        assert isinstance(obs, str) and 0.0 <= reward <= 1.0
        if term or trunc:
            break


@pytest.mark.parametrize(("harness", "call"), [
    ("text", "read " + "9" * 5000),
    ("json", '<tool_call>{"name": "read", "arguments": {"doc": ' + "9" * 5000 + "}}</tool_call>"),
    ("json", '<tool_call>{"name": "read", "arguments": "{\\"doc\\": ' + "9" * 5000 + '}"}</tool_call>'),
])
def test_a_5000_digit_number_in_a_tool_call_is_a_tool_error_not_a_crash(harness, call):
    from sleuth.tasks import load_tasks

    env = sleuth.make("DocRead-v0", harness=harness)
    env.reset(options={"task": load_tasks("hotpotqa:train", limit=1)[0]})
    _, reward, terminated, _, info = env.step(call)
    assert step_info(info).error and not terminated and reward == 0
    _, _, terminated, _, info = env.step("answer: x" if harness == "text" else
                                         '<tool_call>{"name": "answer", "arguments": {"text": "x"}}</tool_call>')
    assert terminated  # the env carries on


def test_docread_passes_gymnasiums_full_env_checker():
    import warnings

    from gymnasium.utils.env_checker import check_env

    from sleuth.tasks import load_tasks

    env = sleuth.make("DocRead-v0", tasks=load_tasks("hotpotqa:train", limit=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env.unwrapped, skip_render_check=True)


def test_env_constructors_are_keyword_only_with_one_budget_name(hotpot_tasks):
    from sleuth.envs.code import CodeEnv

    with pytest.raises(TypeError):
        DocReadEnv(hotpot_tasks)  # positional: refused
    for cls in (DocReadEnv, CodeEnv):
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_turns'"):
            cls(max_turns=2)  # every env's budget is `budget`
    assert DocReadEnv(budget=2).harness.budget == 2 and DocReadEnv().harness.budget == 3


def test_question_answering_envs_share_one_answer_tool():
    from sleuth.envs.qa import QAEnv
    from sleuth.envs.search import SearchEnv

    assert issubclass(DocReadEnv, QAEnv) and issubclass(SearchEnv, QAEnv)
    assert "answer" not in vars(DocReadEnv) and "answer" not in vars(SearchEnv)
    assert list(DocReadEnv().tools) == ["read", "answer"]  # own tools first: the prompt lists them in that order
    assert DocReadEnv(metric="em").verifier.metric == "em"


def test_a_tool_call_result_says_final_and_error_as_fields():
    from sleuth.envs.tools import ToolError, ToolResult, make_tool

    def read(doc: int) -> str:
        """Read."""
        if doc < 0:
            raise ToolError("no such document")
        if doc == 99:
            raise RuntimeError("bug")
        return f"doc {doc}"

    read_tool, answer_tool = make_tool(read), make_tool(lambda text: text.strip(), name="answer", final=True)
    assert read_tool.call({"doc": 1}) == ToolResult("doc 1")
    assert read_tool.call({"doc": -1}) == ToolResult("no such document", error="no such document")
    assert read_tool.call({"doc": 99}).error == "tool 'read' failed: RuntimeError: bug"
    assert read_tool.call({}).error.startswith("missing argument(s) ['doc']")
    assert answer_tool.call({"text": " Paris "}) == ToolResult("Paris", final=True)


def test_read_by_title_matches_a_title_ending_in_a_period(hotpot_tasks):
    """A text-harness argument loses its final period (`read Joseph Seamon Cotter Sr.` once failed to find
    "Joseph Seamon Cotter Sr."): the title is normalised the same way as the argument."""
    task = hotpot_tasks[0]
    docs = [dict(d) for d in task.payload["docs"]]
    docs[3]["title"] = "Joseph Seamon Cotter Sr."
    env = sleuth.make("DocRead-v0", harness="text")
    env.reset(options={"task": replace(task, payload={**task.payload, "docs": docs})})
    for action in ("read Joseph Seamon Cotter Sr.", "read  joseph seamon  cotter sr",
                   'read "Joseph Seamon Cotter Sr."'):
        _, _, _, _, info = env.step(action)
        assert step_info(info).read["doc"] == 3, action
