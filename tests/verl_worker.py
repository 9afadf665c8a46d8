"""Runs inside `.venv-verl` (verl's own pins: transformers<5.11): score rows the way verl does it. verl's
`get_custom_reward_fn` loads sleuth's adapter by file path from a `reward.custom_reward_function` config,
and its `NaiveRewardManager` decodes each response from token ids and calls it. Prints each row's reward
(the sum of its reward tensor) as JSON.

argv[1]: a JSON file {"tokenizer": dir, "adapter": path, "rows": [{prompt, response, data_source,
ground_truth, extra_info}]}."""

import json
import sys

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager.naive import NaiveRewardManager

spec = json.loads(open(sys.argv[1]).read())
tok = AutoTokenizer.from_pretrained(spec["tokenizer"])
config = OmegaConf.create({"reward": {"custom_reward_function": {"path": spec["adapter"], "name": "compute_score",
                                                                 "reward_kwargs": {}}}})
compute_score = get_custom_reward_fn(config)
rows = spec["rows"]
prompts = [tok.encode(r["prompt"]) for r in rows]
responses = [tok.encode(r["response"]) + [tok.eos_token_id] for r in rows]
P, R = max(map(len, prompts)), max(map(len, responses))
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
prompt_t = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])  # verl: prompts left-padded
response_t = torch.tensor([r + [pad] * (R - len(r)) for r in responses])  # responses right-padded
mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (R - len(r))
                     for p, r in zip(prompts, responses, strict=True)])
data = DataProto.from_dict(
    tensors={"prompts": prompt_t, "responses": response_t, "attention_mask": mask,
             "input_ids": torch.cat([prompt_t, response_t], dim=1)},
    non_tensors={"data_source": np.array([r["data_source"] for r in rows], dtype=object),
                 "reward_model": np.array([{"ground_truth": r["ground_truth"]} for r in rows], dtype=object),
                 "extra_info": np.array([r.get("extra_info") or {} for r in rows], dtype=object)})
out = NaiveRewardManager(tok, num_examine=0, compute_score=compute_score)(data, return_dict=True)
print(json.dumps(out["reward_tensor"].sum(-1).tolist()))
