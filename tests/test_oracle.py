"""Each env's oracle (`ToolEnv.oracle`, declared beside the env) solves a task of that env, and the scripted
`oracle` policy finds it from the env class the reset info names."""

import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import load_policy
from sleuth.envs import ToolEnv, tool
from sleuth.envs.code import CodeEnv
from sleuth.envs.docread import DocReadEnv
from sleuth.envs.outcome import ResetInfo, reset_info
from sleuth.envs.parsers import get_parser
from sleuth.envs.registry import oracle_of
from sleuth.envs.search import SearchEnv
from sleuth.tasks import Task, load_tasks, qa_docs
from sleuth.verifiers.base import Verdict


class Shout(ToolEnv):
    """A plugin-style env with only a final tool: the default oracle hands the answer to it."""

    def default_verifier(self):
        return lambda task, response, **_: Verdict(float(response == task.answer.upper()))

    @tool(final=True)
    def shout(self, words: str) -> str:
        """Shout the answer.

        Args:
            words: what to shout
        """
        return words.upper()


def play(env, task: Task) -> tuple[float, list]:
    """Run the env's own oracle through `step` as a policy would (rendered in the env's format)."""
    _, info = env.reset(options={"task": task})
    start = reset_info(info)
    oracle, calls = oracle_of(start), []
    for turn in range(50):
        call = oracle(task, turn, start)
        calls.append(call)
        _, reward, terminated, truncated, _ = env.step(get_parser(reset_info(info).format).render(call))
        if terminated or truncated:
            return reward, calls
    raise AssertionError("the oracle never ended the episode")


def test_the_reset_names_the_env_class_the_env_registry_finds_the_oracle_by(hotpot_tasks):
    _, info = sleuth.make("DocRead-v0").reset(options={"task": hotpot_tasks[0]})
    start = reset_info(info)
    assert start.env == "sleuth.envs.docread:DocReadEnv" and oracle_of(start) == DocReadEnv.oracle
    with pytest.raises(ValueError, match="the reset names no env class"):
        oracle_of(ResetInfo([]))
    with pytest.raises(TypeError, match="is neither a ToolEnv nor a TextGameEnv class"):
        oracle_of(ResetInfo([], env="sleuth.tasks.base:Task"))


@pytest.mark.parametrize("harness", ["json", "text"])
def test_docread_oracle_reads_the_gold_in_list_order_then_answers(hotpot_tasks, harness):
    for task in hotpot_tasks[:4]:
        reward, calls = play(DocReadEnv(harness=harness), task)
        gold = qa_docs(task).gold()
        assert reward == 1.0 and [c.arguments["doc"] for c in calls[:-1]] == gold
        assert calls[-1].name == "answer" and calls[-1].arguments == {"text": task.answer}


def test_search_oracle_searches_and_opens_each_gold_title_or_only_opens_on_a_short_budget(hotpot_tasks):
    from sleuth.envs.retrieval.bm25 import BM25Index
    from sleuth.envs.retrieval.corpus import corpus_from_tasks

    index = BM25Index(corpus_from_tasks(hotpot_tasks))
    task = hotpot_tasks[0]
    reward, calls = play(SearchEnv(retriever=index), task)
    gold = list(qa_docs(task).supporting)
    assert reward == 1.0 and [c.name for c in calls] == ["search", "open"] * len(gold) + ["answer"]
    reward, calls = play(SearchEnv(retriever=index, budget=len(gold)), task)
    assert reward == 1.0 and [c.arguments for c in calls[:-1]] == [{"doc_id": t} for t in gold]


def test_code_oracle_submits_the_reference_program():
    task = load_tasks("mbpp", limit=1)[0]
    reward, calls = play(CodeEnv(), task)
    assert reward == 1.0 and [(c.name, c.arguments) for c in calls] == [("submit", {"code": task.answer})]


def test_swe_oracle_replays_the_gold_patch():
    from sleuth.envs.swe import SWEEnv, swe_gold_plan
    from sleuth.tasks.swe import load_swe

    task = load_swe("toolz-1.2.0")[0]
    env = SWEEnv()
    try:
        reward, calls = play(env, task)
    finally:
        env.close()
    assert reward == 1.0 and calls == swe_gold_plan(task.answer)


def test_an_env_without_its_own_oracle_gets_the_answer_in_its_final_tool():
    task = Task("s", "Say hi.", answer="hi")
    reward, calls = play(Shout(), task)
    assert reward == 1.0 and [(c.name, c.arguments) for c in calls] == [("shout", {"words": "hi"})]


def test_the_oracle_policy_plays_the_env_oracle_in_the_agent_loop(hotpot_tasks):
    (traj,) = run_episodes(lambda: Shout(harness="text"), [Task("s", "Say hi.", answer="hi")], load_policy("oracle"))
    assert traj.reward == 1.0 and traj.turns[0].tool_call == {"name": "shout", "arguments": {"words": "hi"}}
    tasks = {t.id: t for t in hotpot_tasks}
    for traj in run_episodes(lambda: sleuth.make("DocRead-v0"), hotpot_tasks[:3], load_policy("oracle")):
        assert traj.reward == 1.0 and len(traj.turns) == len(qa_docs(tasks[traj.task_id]).gold()) + 1


def test_the_title_oracle_reads_the_named_gold_first_by_title_and_is_the_oracle_elsewhere(hotpot_tasks):
    trajs = run_episodes(lambda: sleuth.make("DocRead-v0"), hotpot_tasks[:6], load_policy("oracle-title"))
    tasks = {t.id: t for t in hotpot_tasks}
    for traj in trajs:
        task = tasks[traj.task_id]
        docs, question = qa_docs(task), task.question.lower()
        named_first = sorted(docs.gold(), key=lambda i: docs.docs[i].title.lower() not in question)  # stable
        assert [t.tool_call["arguments"]["doc"] for t in traj.turns[:-1]] == [docs.titles[i] for i in named_first]
        assert traj.reward == 1.0
    (shout,) = run_episodes(lambda: Shout(), [Task("s", "Say hi.", answer="hi")], load_policy("oracle-title"))
    assert shout.reward == 1.0
