"""Token-in/token-out and the agent loop, with the real SmolLM2 tokenizer and chat template."""

import dataclasses

import pytest

import sleuth
from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.base import Generation, SamplingParams
from sleuth.agents.policies.load import load_policy
from sleuth.envs.outcome import reset_info
from sleuth.tasks import Task


def conversation(traj, reset_messages):
    msgs = list(reset_messages)
    for turn in traj.turns:
        msgs.append({"role": "assistant", "content": turn.action_text})
        if turn.observation_ids:
            msgs.append({"role": "tool", "content": turn.observation})
    return msgs


def reset_messages(task, harness):
    env = sleuth.make("DocRead-v0", harness=harness)
    return reset_info(env.reset(options={"task": task})[1]).messages


@pytest.mark.parametrize("harness", ["json", "text"])
def test_trajectory_ids_equal_the_chat_template_of_the_whole_conversation(hotpot_tasks, tokenizer, harness):
    policy = load_policy("oracle")
    trajs = list(run_episodes(lambda: sleuth.make("DocRead-v0", harness=harness), hotpot_tasks[:3], policy))
    assert len(trajs) == 3
    for traj in trajs:
        task = next(t for t in hotpot_tasks if t.id == traj.task_id)
        full = tokenizer.apply_chat_template(conversation(traj, reset_messages(task, harness)), tokenize=False)
        expected = tokenizer.encode(full, add_special_tokens=False)
        # The documented difference: the template's "\n" after the final <|im_end|> is not in the trajectory.
        assert traj.token_ids() + tokenizer.encode("\n", add_special_tokens=False) == expected
        mask = traj.loss_mask()
        policy_ids = [i for i, m in zip(traj.token_ids(), mask, strict=True) if m]
        assert policy_ids == [i for turn in traj.turns for i in turn.action_ids]
        assert tokenizer.decode(policy_ids) == "".join(t.action_text + "<|im_end|>" for t in traj.turns)
        assert traj.verdict.details["em"] == 1.0


class CutOff:
    """Test double: emits canonical ids with no end-of-turn token, as if max_tokens were hit."""

    name, version, max_context, parallel_calls = "cutoff", 7, None, 1

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, requests, sampling):
        text = "read 1"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [Generation(ids, [-1.0] * len(ids), text, "length") for _ in requests]


def test_cut_off_actions_are_closed_by_observation_tokens(hotpot_tasks, tokenizer):
    traj = next(run_episodes(lambda: sleuth.make("DocRead-v0", harness="text", budget=1), hotpot_tasks[:1],
                             CutOff(tokenizer)))
    first = traj.turns[0]
    assert first.finish_reason == "length" and first.policy_version == 7
    assert tokenizer.decode(first.observation_ids).startswith("<|im_end|>\n<|im_start|>tool\n[1] ")
    full = tokenizer.apply_chat_template(conversation(traj, reset_messages(hotpot_tasks[0], "text")), tokenize=False)
    # after the last (cut-off) action the template adds "<|im_end|>\n"
    assert traj.token_ids() + tokenizer.encode("<|im_end|>\n", add_special_tokens=False) == \
        tokenizer.encode(full, add_special_tokens=False)
    assert traj.truncated and traj.stop_reason == "budget"


def test_bad_task_yields_an_error_trajectory_and_the_rest_still_run(hotpot_tasks):
    bad = Task(id="broken", question="q")  # no documents
    trajs = {t.task_id: t for t in run_episodes(lambda: sleuth.make("DocRead-v0"),
                                                [bad, *hotpot_tasks[:2]], load_policy("oracle"))}
    assert "no payload['docs']" in trajs["broken"].error
    assert all(trajs[t.id].reward == 1.0 for t in hotpot_tasks[:2])


def test_context_limit_truncates(hotpot_tasks):
    traj = next(run_episodes(lambda: sleuth.make("DocRead-v0"), hotpot_tasks[:1], load_policy("oracle"),
                             SamplingParams(max_tokens=16), max_context=450))
    assert len(traj.turns) < 3
    assert traj.truncated and traj.stop_reason == "context_limit"


def test_a_first_prompt_over_the_context_is_never_sent_and_the_run_goes_on(hotpot_tasks):
    """A task whose prompt cannot fit ends as truncated, with the reason, before the engine sees it."""
    class Counting:
        def __init__(self):
            self.inner, self.prompts = load_policy("oracle"), []
            self.name, self.version, self.tokenizer, self.parallel_calls = "oracle", 0, self.inner.tokenizer, 1
            self.max_context = 2000

        def generate(self, requests, sampling):
            self.prompts += [len(r.prompt_ids) for r in requests]
            return self.inner.generate(requests, sampling)

    huge = dataclasses.replace(hotpot_tasks[0], id="huge", question="Who? " + "word " * 5000)
    policy = Counting()
    trajs = {t.task_id: t for t in run_episodes(lambda: sleuth.make("DocRead-v0"), [huge, hotpot_tasks[1]], policy,
                                                SamplingParams(max_tokens=16))}
    assert trajs["huge"].truncated and trajs["huge"].stop_reason == "prompt_too_long" and not trajs["huge"].failed
    assert "does not fit the policy's context of 2000" in trajs["huge"].meta["prompt_too_long"]
    assert not trajs["huge"].turns and trajs["huge"].verdict is None
    assert trajs[hotpot_tasks[1].id].reward == 1.0  # the run went on
    assert policy.prompts and max(policy.prompts) + 16 <= 2000  # nothing over the context was sent


def test_renderer_needs_a_chat_template(tokenizer):
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        ChatRenderer(NoTemplate())


@pytest.mark.slow
def test_real_model_loop_is_token_exact(hotpot_tasks, smollm2, tokenizer):
    """With the real SmolLM2, sampled ids are kept as they came; every non-policy span equals the template."""
    trajs = list(run_episodes(lambda: sleuth.make("DocRead-v0", harness="text", budget=1), hotpot_tasks[:2],
                              smollm2, SamplingParams(max_tokens=12, temperature=1.0, seed=0)))
    assert len(trajs) == 2
    renderer = ChatRenderer(tokenizer)
    for traj in trajs:
        task = next(t for t in hotpot_tasks if t.id == traj.task_id)
        assert traj.prompt_ids == renderer.prompt_ids(reset_messages(task, "text"))
        for turn in traj.turns:
            assert len(turn.action_logprobs) == len(turn.action_ids) > 0
            assert all(lp <= 0.0 for lp in turn.action_logprobs)
            assert tokenizer.decode(turn.action_ids, skip_special_tokens=True) == turn.action_text
            if turn.observation_ids:
                expected = renderer.observation_ids([{"role": "tool", "content": turn.observation}], turn.action_ids)
                assert turn.observation_ids == expected
        assert sum(traj.loss_mask()) == traj.num_policy_tokens
