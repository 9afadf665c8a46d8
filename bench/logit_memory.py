"""Peak memory and time of one policy update when most positions are scored (long single-turn completions,
as in code or SWE patches): the LM head and log-softmax over all n scored positions at once vs
`update.logit_chunk` positions at a time (each chunk recomputed in backward).

The batch: 4 trajectories of SmolLM2-tokenised real text, a HotpotQA question as the prompt and its
context paragraphs as a 1,000-token "completion" (all of it scored), one packed micro-batch of ~4,100
tokens. Each arm runs in a fresh process (peak RSS is per process), alternating, medians of the repeats,
an update timed after a warm-up update at lr 1e-9. Reports s/update, peak RSS and the loss and
gradient-norm differences (rounding only).

Run: `.venv/bin/python bench/logit_memory.py [--repeats 2] [--completion 1000]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import publish, smollm2_update_setup

ARMS = {"whole (n at once)": 1 << 30, "chunks of 1024": 1024}


def batch(completion: int) -> list:
    from sleuth.agents.policies.load import load_tokenizer
    from sleuth.agents.trajectory import Trajectory, Turn
    from sleuth.tasks import load_tasks, qa_docs

    tok = load_tokenizer()
    out = []
    for task in load_tasks("hotpotqa:train", limit=4):
        text = " ".join(d.text for d in qa_docs(task).docs)
        ids = tok.encode(text, add_special_tokens=False)[:completion]
        prompt = tok.encode(task.question, add_special_tokens=False)
        out.append(Trajectory(task.id, "text", prompt, turns=[Turn(ids, [0.0] * len(ids), "")]))
    return out


def worker(chunk: int, path: Path) -> dict:
    upd, trajs, advs = smollm2_update_setup(path, 8192, logit_chunk=chunk)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    upd.update(trajs, advs)  # warm-up
    t = time.perf_counter()
    stats = upd.update(trajs, advs)
    return {"s": time.perf_counter() - t, "loss": stats.loss_policy + stats.loss_entropy,
            "grad_norm": stats.grad_norm, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "loaded_rss_mb": loaded, "scored": sum(t.num_policy_tokens for t in trajs),
            "tokens": sum(len(t.token_ids()) for t in trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--completion", type=int, default=1000)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch)))
        return
    if args.repeats < 1 or args.completion < 1:
        ap.error("--repeats and --completion must be ≥ 1")
    path = Path(tempfile.mkdtemp()) / "batch.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in batch(args.completion)))
    runs: dict[str, list[dict]] = {a: [] for a in ARMS}
    names = list(ARMS)
    for r in range(args.repeats):
        for arm in names if r % 2 == 0 else names[::-1]:  # alternating: the machine's drift hits both arms
            out = subprocess.run([sys.executable, __file__, "--worker", str(ARMS[arm]), "--batch", str(path)],
                                 capture_output=True, text=True, check=True)
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(arm, runs[arm][-1], flush=True)
    base = names[0]
    med = {a: statistics.median(x["s"] for x in runs[a]) for a in names}
    peak = {a: max(x["rss_mb"] for x in runs[a]) for a in names}
    f = runs[base][0]
    lines = [f"Batch: 4 trajectories, {f['tokens']} tokens, {f['scored']} scored; one packed micro-batch; PPO loss + "
             f"entropy bonus, T = 0.8; ZeRO-2, fp32, one process; fresh process per arm, alternating, medians of "
             f"{args.repeats}.", "", "| head + log-softmax | s / update | peak RSS MB (after load) | vs whole |",
             "|---|---|---|---|"]
    for a in names:
        lines.append(f"| {a} | {med[a]:.2f} | {peak[a]:.0f} ({runs[a][0]['loaded_rss_mb']:.0f}) | "
                     f"{med[a] / med[base]:.2f}× time, {peak[a] / peak[base]:.2f}× peak |")
    other = runs[names[1]][0]
    lines += ["", f"|Δ loss| {abs(other['loss'] - f['loss']):.1e}, |Δ grad norm| "
                  f"{abs(other['grad_norm'] - f['grad_norm']):.1e} (grad norm {f['grad_norm']:.4f})."]
    publish("logit_memory", "Scored logits whole vs chunked (CPU, SmolLM2-135M)", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
