"""Memory of sampled-token logprobs in the transformers policy, side by side with the usual way.

The usual way to get logprobs out of `model.generate` is `output_logits=True` (or `output_scores`) and a
log-softmax over the stacked result: generate keeps every step's full-vocabulary fp32 logits until it
returns. `TransformersPolicy` records each sampled token's logprob as generation goes
(`agents/policies/hf.py: TokenSampler`). Each way runs in a fresh process on the same model, prompts, seed and
length; the figure is the growth of peak RSS over the loaded model (CPU here; on a GPU the same tensors
sit in GPU memory). The tiny SmolLM2-architecture model keeps the real 49,152-token vocabulary, so the
logits dominate as they do at scale, and the run stays short.

Run: `.venv/bin/python bench/hf_logprobs.py` (in `make bench`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

from common import publish

BATCH, TOKENS = 16, 256

CHILD = r"""
import json, resource, sys, time, torch
from sleuth.agents.policies.hf import TransformersPolicy
from sleuth.agents.policies.base import Request, SamplingParams
way, model, batch, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
policy = TransformersPolicy(model, device="cpu", max_batch=batch)
policy.stop_ids = [-1]  # never stop: every row generates all its tokens
prompts = [[1 + i, 2 + i, 3 + i, 4 + i] for i in range(batch)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
torch.manual_seed(0)
t = time.perf_counter()
if way == "sleuth":
    gens = policy.generate([Request(prompt_ids=p, messages=[], task=None) for p in prompts],
                           SamplingParams(temperature=1.0, max_tokens=tokens))
    lps = [g.logprobs for g in gens]
else:
    ids = torch.tensor(prompts)
    res = policy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=policy.pad_id,
                                return_dict_in_generate=True, output_logits=True)
    new = res.sequences[:, ids.shape[1]:]
    lps = torch.log_softmax(torch.stack(res.logits, 1).float(), -1).gather(-1, new[..., None])[..., 0].tolist()
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mib": (peak - before) / 1024, "s": elapsed, "n": sum(map(len, lps))}))
"""


def run(way: str, model: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, way, model, str(BATCH), str(TOKENS)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from sleuth.agents.policies.models import tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(f"{tmp}/tiny")
        usual, ours = run("output_logits", model), run("sleuth", model)
    assert usual["n"] == ours["n"] == BATCH * TOKENS, (usual, ours)
    logits_mib = BATCH * TOKENS * 49152 * 4 / 2**20
    report = "\n".join([
        f"Batch {BATCH} × {TOKENS} sampled tokens, vocabulary 49,152 (fp32 logits of all steps: "
        f"{logits_mib:,.0f} MiB). Peak RSS growth during generation, fresh process each:",
        "",
        "| way | peak RSS growth (MiB) | time (s) |",
        "|---|---|---|",
        f"| generate(output_logits=True) + log-softmax | {usual['mib']:,.0f} | {usual['s']:.1f} |",
        f"| TransformersPolicy (per-step recorder) | {ours['mib']:,.0f} | {ours['s']:.1f} |",
        "",
        f"Memory ratio: {usual['mib'] / max(ours['mib'], 1):.1f}× less with the recorder; time ratio "
        f"{ours['s'] / usual['s']:.2f}.",
    ])
    publish("hf_logprobs", "Sampled-token logprobs: memory", report)


if __name__ == "__main__":
    main()
