"""Held-out loss of a Tinker training checkpoint against its base model, through the Tinker SDK: the per-token
negative log-likelihood of the assistant replies of HotpotQA *dev* conversations (never trained on by
run_recipe.py's sl_loop, which reads the train split), each conversation scored by both, with a paired-bootstrap 95%
CI of the difference. Run beside `sleuth serve tinker`, in the SDK's venv:

    .venv-tinker/bin/python examples/tinker_cookbook/heldout_nll.py --base-url http://127.0.0.1:8004 \\
        --model-dir ~/.cache/sleuth/smollm2-135m-instruct --state tinker://RUN/weights/final --n 200
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from run_recipe import RENDERER, register_model


def conversations(data_dir: Path, n: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in (data_dir / "hotpotqa" / "dev.jsonl").open()][:n]
    return [[{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}] for r in rows]


def nll_per_conversation(client, datums) -> np.ndarray:
    out = client.forward(datums, "cross_entropy").result().loss_fn_outputs
    return np.array([-(o["logprobs"].to_numpy() * d.loss_fn_inputs["weights"].to_numpy()).sum() /
                     d.loss_fn_inputs["weights"].to_numpy().sum() for o, d in zip(out, datums, strict=True)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model-name", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--state", required=True, help="the checkpoint's tinker:// state path (save_state)")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    register_model(args.model_name, args.model_dir)
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer(RENDERER, get_tokenizer(args.model_name))
    datums = [conversation_to_datum(c, renderer, 512, renderers.TrainOnWhat.ALL_ASSISTANT_MESSAGES)
              for c in conversations(Path(os.environ.get("SLEUTH_DATA", "../shared/data")), args.n)]
    sc = tinker.ServiceClient(base_url=args.base_url)
    base = nll_per_conversation(sc.create_lora_training_client(base_model=args.model_name, rank=4), datums)
    trained = nll_per_conversation(sc.create_training_client_from_state(args.state), datums)
    diff = trained - base
    rng = np.random.default_rng(0)
    boots = np.array([diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(10_000)])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    print(json.dumps({"n": len(diff), "base_nll": float(base.mean()), "trained_nll": float(trained.mean()),
                      "diff": float(diff.mean()), "ci95": [float(lo), float(hi)]}))


if __name__ == "__main__":
    main()
