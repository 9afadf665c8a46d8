"""Tinker SDK client code run against `sleuth serve tinker` by tests/test_tinker_server.py, in the venv that holds
the SDK (`make tinker`). Usage: python -P tinker_client.py SCENARIO[,SCENARIO...] BASE_URL MODEL_NAME MODEL_DIR [ARG];
runs the scenarios in order in this one process (one interpreter start for several) and prints one JSON object:
each scenario's name → what it measured, or {"failed": its traceback}, so a scenario's fault stays in the test that
reads it. The assertions live in the test; this is plain user code of the SDK."""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

import tinker
import torch
from tinker import TensorData, types
from transformers import AutoModelForCausalLM, AutoTokenizer

SCENARIO, URL, NAME, MODEL_DIR = sys.argv[1:5]
ARG = sys.argv[5] if len(sys.argv) > 5 else None
os.environ.setdefault("TINKER_API_KEY", "tml-local")
TOKENIZER = AutoTokenizer.from_pretrained(MODEL_DIR)
IDS = TOKENIZER.encode("The capital of France is Paris, and the capital of Italy is Rome.")


def datum(ids, **inputs) -> types.Datum:
    """Next-token datum over `ids`; extra inputs are per-position lists."""
    fields = {"target_tokens": TensorData.from_torch(torch.tensor(ids[1:]))}
    fields.update({k: TensorData.from_torch(torch.tensor(v, dtype=torch.float32)) for k, v in inputs.items()})
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=fields)


def local_logprobs(ids) -> list[float]:
    """log p(ids[t] | ids[:t]) by transformers itself, for t ≥ 1."""
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def train() -> dict:
    sc = tinker.ServiceClient(base_url=URL)
    tc = sc.create_lora_training_client(base_model=NAME, rank=4, seed=0, train_unembed=ARG != "vllm")
    other = sc.create_lora_training_client(base_model=NAME, rank=8, train_unembed=ARG != "vllm")  # a second client
    ce = datum(IDS, weights=[1.0] * (len(IDS) - 1))
    first = tc.forward([ce], "cross_entropy").result()
    out = {"forward": first.loss_fn_outputs[0]["logprobs"].tolist(), "local": local_logprobs(IDS),
           "forward_loss": first.metrics["loss:sum"], "losses": []}
    for _ in range(4):
        fb = tc.forward_backward([ce], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        out["losses"].append(fb.metrics["loss:sum"])
    trained = tc.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    out["other"] = other.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(IDS[:5])
    s = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)).result()
    rescored = [sampler.compute_logprobs(types.ModelInput.from_ints(IDS[:5] + q.tokens)).result()[5:]
                for q in s.sequences]
    again = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)).result()
    top = sampler.sample(types.ModelInput.from_ints(IDS), 1, types.SamplingParams(max_tokens=1),
                         include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
    base = sc.create_sampling_client(base_model=NAME).compute_logprobs(types.ModelInput.from_ints(IDS)).result()
    out.update(trained=trained, sampler_logprobs=sampler.compute_logprobs(types.ModelInput.from_ints(IDS)).result(),
               base_logprobs=base, samples=[(q.tokens, q.logprobs, q.stop_reason) for q in s.sequences],
               rescored=rescored, resampled=[q.tokens for q in again.sequences], prompt_logprobs=top.prompt_logprobs,
               topk=[[list(p) for p in row] if row else None for row in top.topk_prompt_logprobs])
    greedy = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0)).result().sequences[0]
    stop = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=8, stop=[greedy.tokens[2]], temperature=0.0))
    out.update(greedy=greedy.tokens, stopped=[(q.tokens, q.stop_reason) for q in stop.result().sequences])
    return out


def losses() -> dict:
    """Each RL loss on one datum, with the server's logprobs to recompute it here by Tinker's formulas."""
    tc = tinker.ServiceClient(base_url=URL).create_lora_training_client(base_model=NAME, rank=4)
    n = len(IDS) - 1
    q = [-1.0 - 0.3 * (t % 5) for t in range(n)]
    adv = [(-1.0) ** t * (1 + t % 3) for t in range(n)]
    out = {}
    for fn, cfg in (("importance_sampling", None), ("ppo", None), ("cispo", None),
                    ("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.1})):
        fb = tc.forward_backward([datum(IDS, logprobs=q, advantages=adv)], fn, cfg).result()
        out[f"{fn}{cfg or ''}"] = {"loss": fb.metrics["loss:sum"], "lp": fb.loss_fn_outputs[0]["logprobs"].tolist()}
    custom = tc.forward_backward_custom([datum(IDS)], lambda data, lps: ((lps[0] ** 2).sum(), {"sq": 1.0})).result()
    out.update(q=q, adv=adv, custom=custom.metrics)
    return out


def errors() -> dict:
    sc = tinker.ServiceClient(base_url=URL)
    tc = sc.create_lora_training_client(base_model=NAME, rank=4)
    out = {}

    def caught(key, fn):
        try:
            fn()
            out[key] = None
        except Exception as e:  # what the SDK raises, shown as the user sees it
            out[key] = f"{type(e).__name__}: {e}"

    caught("unknown_loss", lambda: tinker.ServiceClient(base_url=URL).create_lora_training_client(
        base_model=NAME, rank=4).forward_backward([datum(IDS, weights=[1.0] * (len(IDS) - 1))], "dro").result())
    bad = types.Datum(model_input=types.ModelInput.from_ints(IDS[:-1]), loss_fn_inputs={
        "target_tokens": TensorData.from_torch(torch.tensor(IDS[1:])), "weights": TensorData.from_torch(torch.ones(3))})
    caught("length_mismatch", lambda: tc.forward_backward([bad], "cross_entropy").result())
    caught("never_saved", lambda: sc.create_sampling_client(
        model_path="tinker://nobody:train:0/sampler_weights/none").sample(
        types.ModelInput.from_ints(IDS[:3]), 1, types.SamplingParams(max_tokens=2)).result())
    caught("tied_unembed", lambda: sc.create_lora_training_client(base_model=NAME, rank=4,
                                                                  train_unembed=True).get_info())
    caught("other_model", lambda: sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).get_info())
    return out


def old_sdk() -> dict:
    import tinker.lib.internal_client_holder as holder

    holder.tinker_sdk_version = "0.37.0"  # what a client of another release sends in its handshake
    try:
        tinker.ServiceClient(base_url=URL).create_lora_training_client(base_model=NAME, rank=4).get_info()
        return {"error": None}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def save() -> dict:
    tc = tinker.ServiceClient(base_url=URL).create_lora_training_client(base_model=NAME, rank=4, seed=1)
    ce = datum(IDS, weights=[1.0] * (len(IDS) - 1))
    tc.forward_backward([ce], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_state("kept").result().path
    return {"path": path, "lp": tc.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()}


def resume() -> dict:
    tc = tinker.ServiceClient(base_url=URL).create_training_client_from_state_with_optimizer(ARG)
    ce = datum(IDS, weights=[1.0] * (len(IDS) - 1))
    lp = tc.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    tc.forward_backward([ce], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return {"lp": lp, "model_id": tc.model_id}


if __name__ == "__main__":
    results = {}
    for scenario in SCENARIO.split(","):
        try:
            results[scenario] = globals()[scenario]()
        except Exception:  # the test that reads this scenario fails with its traceback
            results[scenario] = {"failed": traceback.format_exc()}
    print(json.dumps(results, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))
