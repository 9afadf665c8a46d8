"""BFCL v4 as sleuth envs: items loaded with bfcl-eval's own loaders (main venv, data only), run against bfcl-eval's
own backends and scored by its own checker in `.venv-bfcl` behind the Remote env protocol, as a user gets them from
`sleuth.make("bfcl:<category>")`. The oracle (BFCL's possible answer) must score 1.0; bad replies get BFCL's own
outcomes (its error strings as tool results, its step limit), never a crash and never an unscored-as-scored mix-up."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

import sleuth
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation
from sleuth.agents.policies.load import load_policy, load_tokenizer
from sleuth.envs.families import venv_server
from sleuth.envs.families.bfcl import BFCL
from sleuth.envs.outcome import reset_info, step_info
from sleuth.envs.remote import RemoteEnvError
from sleuth.tasks import load_tasks
from sleuth.tasks.bfcl import CATEGORIES, MULTI_TURN, BFCLDataError, scenario_of
from sleuth.tasks.holdout import check_tasks, check_texts

REPO = Path(__file__).resolve().parents[1]


def _venv() -> bool:
    try:
        BFCL.python()
        return True
    except ImportError:
        return False


needs_venv = pytest.mark.skipif(not _venv(), reason="no BFCL venv (make bfcl)")


def _task(item_id: str):
    category = item_id.rsplit("_", 1)[0]
    return next(t for t in load_tasks(f"bfcl:{category}") if t.id == item_id)


class Scripted:
    """Replies with the given texts in order (then an empty reply), as a policy."""

    name, version, max_context, parallel_calls = "scripted-replies", 0, None, 1

    def __init__(self, replies: list[str]):
        self.tokenizer, self.replies = load_tokenizer("smollm2"), list(replies)

    def generate(self, requests, sampling):
        out = []
        for req in requests:
            text = self.replies[req.turn] if req.turn < len(self.replies) else ""
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop"))
        return out


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


# -- tasks ------------------------------------------------------------------------------------------------
def test_items_are_bfcl_items_with_bfcl_ids_and_every_offline_category():
    tasks = load_tasks("bfcl:all")
    counts = Counter(t.source for t in tasks)
    assert set(counts) == {f"bfcl/{c}" for c in CATEGORIES}
    assert counts["bfcl/simple_python"] == 400 and counts["bfcl/multi_turn_base"] == 200
    first = load_tasks("bfcl:simple_python[0:3]")
    assert [t.id for t in first] == ["simple_python_0", "simple_python_1", "simple_python_2"]
    base = _task("multi_turn_base_0")
    assert base.payload["entry"]["initial_config"] and len(base.payload["ground_truth"]) == len(
        base.payload["entry"]["question"])
    miss = _task("multi_turn_miss_func_0")  # BFCL's loader moved the held-out function's doc out of the list
    held_out = {f["name"] for fs in miss.payload["entry"]["missed_function"].values() for f in fs}
    assert held_out and not held_out & {f["name"] for f in miss.payload["entry"]["function"]}


def test_the_split_holds_out_whole_scenarios_across_the_multi_turn_variants():
    train = load_tasks("bfcl:multi_turn:train")
    test = load_tasks("bfcl:multi_turn:test")
    assert train and test and len(train) + len(test) == 800
    test_scenarios = {scenario_of(t.id) for t in test}
    assert not test_scenarios & {scenario_of(t.id) for t in train}
    for scenario in test_scenarios:  # each held-out scenario in all four variants
        assert sum(scenario_of(t.id) == scenario for t in test) == len(MULTI_TURN)
    assert {t.id for t in load_tasks("bfcl:test")} >= {t.id for t in test}


def test_no_training_item_asks_or_holds_a_held_out_question():
    """BFCL asks some questions in several items (`simple_python_12`'s is a live item's too) and its live items
    reuse requests inside longer ones: the split keeps each with its held-out twin, so the held-out checks of
    RL tasks (same question) and of SFT records (a held-out question inside) pass on all of `bfcl:train`."""
    train, test = load_tasks("bfcl:train"), load_tasks("bfcl:test")
    assert len(train) + len(test) == 4441 and len(test) > 1000
    check_tasks(train, test, "bfcl:train")
    check_texts([(t.id, f"{t.question} {json.dumps(t.payload['ground_truth'])}") for t in train], test, "bfcl:train")


@pytest.mark.parametrize("spec, said", [("bfcl:web_search", "network"), ("bfcl:memory_kv", "prerequisite"),
                                        ("bfcl:simple_pyhton", "categories"), ("bfcl:simple_python:dev", "split")])
def test_a_category_that_does_not_run_here_is_refused_in_one_line(spec, said):
    with pytest.raises(BFCLDataError, match=said):
        load_tasks(spec)


# -- the env ----------------------------------------------------------------------------------------------
@needs_venv
def test_the_oracle_scores_one_on_items_of_every_category():
    """The first three items of each category, through `bfcl:all` in BFCL's venv (every item:
    experiments/bfcl_oracle.py, whose exceptions are BFCL ground truths that fail BFCL's own checker, listed in
    docs/bfcl.md)."""
    tasks = [t for c in CATEGORIES for t in load_tasks(f"bfcl:{c}[0:3]")]
    trajs = list(run_episodes(lambda: sleuth.make("bfcl:all"), tasks, load_policy("oracle"), concurrency=8))
    assert len(trajs) == len(tasks) and not [t.error for t in trajs if t.failed]
    assert {t.task_id: t.verdict.score for t in trajs} == {t.id: 1.0 for t in tasks}
    multi = next(t for t in trajs if t.task_id == "multi_turn_base_0")
    assert multi.verdict.details["user_turns"] == 4 and not multi.verdict.details["force_quit"]


@needs_venv
def test_a_wrong_answer_scores_zero_with_the_checkers_reason():
    task = _task("simple_python_0")  # calculate_triangle_area(base=10, height=5)
    env = sleuth.make("bfcl:simple_python")
    _, info = env.reset(options={"task": task})
    assert [t["function"]["name"] for t in reset_info(info).tools] == ["calculate_triangle_area"]
    assert "calculate_triangle_area" in reset_info(info).messages[0]["content"]  # the tools in the system message
    _, reward, terminated, _, info = env.step(call("calculate_triangle_area", base=10, height=6))
    assert terminated and reward == 0.0 and step_info(info).verdict.details["error_type"] == "value_error:others"
    env.reset(options={"task": task})  # the right answer: the checker's score is the reward training reads
    _, reward, terminated, _, info = env.step(call("calculate_triangle_area", base=10, height=5))
    assert terminated and reward == 1.0 == step_info(info).verdict.score
    env.close()


@needs_venv
def test_bad_calls_get_bfcls_own_outcomes_and_a_turn_that_never_ends_is_force_quit():
    env = sleuth.make("bfcl:multi_turn_base")
    _, info = env.reset(options={"task": _task("multi_turn_base_0")})
    assert {"cd", "mv", "mkdir"} <= {t["function"]["name"] for t in reset_info(info).tools}
    obs, _, done, _, info = env.step(call("cd", folder="no_such_folder"))  # the backend's own error
    assert not done and step_info(info).messages[0]["role"] == "tool" and "No such file or directory" in obs
    obs, _, done, _, info = env.step(call("cd", directory="document"))  # a wrong argument name
    assert not done and obs.startswith("Error during execution:") and "unexpected keyword argument" in obs
    for _ in range(18):  # 21 steps in one turn: BFCL force-quits the item at the 21st (MAXIMUM_STEP_LIMIT 20)
        obs, reward, done, _, info = env.step(call("ls"))
        assert not done
    obs, reward, done, truncated, info = env.step(call("ls"))
    assert done and reward == 0.0 and step_info(info).verdict.details["force_quit"]
    assert step_info(info).verdict.details["error_type"] == "multi_turn:force_terminated"
    # a call to a function the item does not offer is dropped, so a reply of only such calls ends the user turn
    _, info = env.reset(options={"task": _task("multi_turn_base_0")})
    obs, _, done, _, info = env.step(call("rm_rf", path="/"))
    out = step_info(info)
    assert not done and out.messages[0]["role"] == "user" and "grep" in obs and "(dropped)" in out.error
    obs, _, done, _, info = env.step('<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>')  # bad JSON
    assert not done and step_info(info).messages[0]["role"] == "user"  # ends the turn, as BFCL's decoding failure does
    env.close()


@needs_venv
def test_episodes_of_one_item_never_share_backend_state():
    """A GRPO group plays one item G times at once: each episode has its own file system."""
    task = _task("multi_turn_base_0")
    envs = [sleuth.make("bfcl:multi_turn_base") for _ in range(2)]
    for env in envs:
        env.reset(options={"task": task})
    envs[0].step(call("mkdir", dir_name="only_in_the_first"))
    seen = [env.step(call("ls"))[0] for env in envs]
    assert "only_in_the_first" in seen[0] and "only_in_the_first" not in seen[1]
    for env in envs:
        env.close()


@needs_venv
def test_a_killed_server_fails_the_episode_unscored_and_the_next_env_starts_another():
    env = sleuth.make("bfcl:multi_turn_base")
    env.reset(options={"task": _task("multi_turn_base_0")})
    proc = venv_server.server_process(BFCL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    with pytest.raises(RemoteEnvError, match="unreachable"):
        env.step(call("ls"))
    trajs = list(run_episodes(lambda: sleuth.make("bfcl:multi_turn_base"), [_task("multi_turn_base_1")],
                              load_policy("oracle")))
    assert trajs[0].verdict.score == 1.0 and venv_server.server_process(BFCL).pid != proc.pid


@needs_venv
def test_an_env_of_one_category_refuses_an_item_of_another():
    env = sleuth.make("bfcl:simple_python")
    with pytest.raises(RemoteEnvError, match="multi_turn_base item"):
        env.reset(options={"task": _task("multi_turn_base_0")})
    env.close()


# -- sleuth eval and the leaderboard table ----------------------------------------------------------------
@needs_venv
def test_sleuth_eval_writes_the_leaderboard_table_and_bfcl_table_pairs_two_runs(tmp_path, capsys):
    """`random-legal` calls a `move` tool no BFCL item offers: its calls are dropped, so it answers nothing. The
    commands run in this process (`main`, as the `sleuth` script calls it), on the `bfcl:all` server it holds."""
    from procs import sleuth_here

    from sleuth.tasks import write_tasks

    tasks = [t for spec in ("simple_python[0:6]", "irrelevance[0:6]", "multi_turn_base[0:3]")
             for t in load_tasks(f"bfcl:{spec}")]
    write_tasks(tasks, tmp_path / "items.jsonl")
    for policy in ("oracle", "random-legal"):
        said = sleuth_here("eval", "--env", "bfcl:all", "--tasks", tmp_path / "items.jsonl", "--policy", policy,
                           "--out", tmp_path / policy, capfd=capsys)
        assert said.returncode == 0, said.stderr[-2000:]
        assert "| Overall Acc |" in said.stdout and (tmp_path / policy / "bfcl.md").is_file()
    table = json.loads((tmp_path / "oracle" / "bfcl.json").read_text())["runs"][0]["columns"]
    assert next(r for r in table if r["column"] == "simple_python")["accuracy"] == 1.0
    assert next(r for r in table if r["column"] == "live_simple")["accuracy"] is None  # not played: "—"
    said = sleuth_here("bfcl-table", tmp_path / "oracle", tmp_path / "random-legal", "--out", tmp_path / "cmp",
                       capfd=capsys)
    assert said.returncode == 0, said.stderr
    paired = json.loads((tmp_path / "cmp" / "bfcl.json").read_text())["paired"]
    simple = next(r for r in paired if r["column"] == "simple_python")
    assert simple["diff"] == -1.0 and simple["b_worse"] == simple["n"] == 6
    irrelevance = next(r for r in paired if r["column"] == "irrelevance")
    assert irrelevance["diff"] == 0.0  # no call is the right answer there


# A template that renders tools itself (as Qwen's does): the tools as JSON lines in its system turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{%- endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@needs_venv
def test_the_template_harness_shows_the_tools_through_the_models_own_chat_template():
    """harness `template`: no JSON-harness instructions; the tools reach the model through its chat template, and
    the oracle's calls in that format still score 1.0. A template that does not render tools is refused."""
    from sleuth.agents.policies.scripted import Oracle

    tokenizer = load_tokenizer("smollm2")
    tokenizer.chat_template = TOOL_TEMPLATE
    tasks = load_tasks("bfcl:simple_python[0:2]") + load_tasks("bfcl:multi_turn_base[0:1]")
    trajs = list(run_episodes(lambda: sleuth.make("bfcl:all", harness="template"), tasks, Oracle(tokenizer)))
    assert [t.verdict.score for t in trajs] == [1.0, 1.0, 1.0]
    prompt = tokenizer.decode(next(t for t in trajs if t.task_id == "simple_python_0").prompt_ids)
    assert "# Tools" in prompt and "calculate_triangle_area" in prompt and "You can call these tools" not in prompt
    with pytest.raises(ValueError, match="does not render tools"):  # SmolLM2's own template ignores `tools`
        list(run_episodes(lambda: sleuth.make("bfcl:all", harness="template"), tasks[:1], load_policy("oracle")))
