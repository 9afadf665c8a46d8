"""The model-less tokenizer of the core install: exact and reversible, accepted by the chat renderer, and a
scripted policy's episodes score the same with it as with SmolLM2's tokenizer."""

import sleuth
from sleuth.agents.byte_chat import ByteChatTokenizer
from sleuth.agents.chat import ChatRenderer
from sleuth.agents.loop.episodes import run_episodes
from sleuth.agents.policies.load import SCRIPTED_POLICIES, load_tokenizer


def test_bytes_and_markers_round_trip():
    tok = ByteChatTokenizer()
    text = "<|im_start|>user\nQui a écrit « Sula » ? 🙂<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 256 and ids[-2] == 257 and max(ids[1:-2]) < 256
    assert len(ids) == len(text.replace("<|im_start|>", "S").replace("<|im_end|>", "E").encode())
    assert tok.decode(ids) == text and tok.decode(ids, skip_special_tokens=True) == text[12:-11] + "\n"


def test_the_chat_renderer_takes_it_and_extends_prompts_token_exactly():
    tok = ByteChatTokenizer()
    r = ChatRenderer(tok)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    prompt = r.prompt_ids(msgs)
    assert tok.decode(prompt) == tok.apply_chat_template(msgs, add_generation_prompt=True)
    action = tok.encode("read 3") + [tok.eos_token_id]
    tool = [{"role": "tool", "content": "doc 3 text"}]
    whole = tok.apply_chat_template([*msgs, {"role": "assistant", "content": "read 3"}, *tool],
                                    add_generation_prompt=True)
    assert tok.decode(prompt + action + r.observation_ids(tool, action)) == whole


def test_scripted_policies_score_the_same_with_bytes_as_with_the_models_tokenizer(hotpot_tasks):
    for name in ("oracle", "lexical", "first-k"):
        scores = []
        for tok in (load_tokenizer(), ByteChatTokenizer()):
            policy = SCRIPTED_POLICIES.get(name)(tok, seed=0)
            trajs = run_episodes(lambda: sleuth.make("DocRead-v0"), hotpot_tasks[:6], policy)
            scores.append(sorted((t.task_id, t.reward, t.verdict.details.get("support_recall")) for t in trajs))
        assert scores[0] == scores[1], name
