"""Run one of tinker-cookbook's recipes, its code unchanged, against `sleuth serve tinker`.

The recipe (`tinker_cookbook.recipes.sl_loop`, `rl_loop` or `distillation.on_policy_distillation`) is imported and
its entry point called with its own config class, as published. This driver supplies only what the recipe's
surroundings would: the served model registered with the cookbook (its tokenizer from the local model directory, and
`qwen3_instruct`, the ChatML renderer whose prompts are SmolLM2's own chat format), and, as no Hugging Face hub is
reachable here, the recipe's dataset from local data:
- sl_loop (no_robots conversations): HotpotQA training questions with their answers as the assistant's reply
  ($SLEUTH_DATA/hotpotqa/train.jsonl);
- rl_loop (GSM8K: a question and an answer ending in `#### N`): one-digit additions, drawn with a fixed seed,
  which the recipe's own reward (the `\\boxed{}` answer graded against N) can score for a 135M model;
- on_policy_distillation (DeepMath prompts): the same additions' questions; the teacher is a model (or a sampler
  checkpoint, `teacher_checkpoint`) of the same server.

Run it in the venv that has tinker and tinker-cookbook (`make tinker`), beside a running server:
    .venv/bin/sleuth serve tinker --port 8004 &
    .venv-tinker/bin/python examples/tinker_cookbook/run_recipe.py rl_loop --base-url http://127.0.0.1:8004 \
        --model-dir ~/.cache/sleuth/smollm2-135m-instruct --config '{"batch_size": 4, "group_size": 4}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from pathlib import Path

RENDERER = "qwen3_instruct"
RECIPES = ("sl_loop", "rl_loop", "on_policy_distillation")


def recipe(name: str):
    """(the recipe's config class, its entry point), imported after the patches above are in place."""
    if name == "sl_loop":
        from tinker_cookbook.recipes import sl_loop

        return sl_loop.Config, sl_loop.main
    if name == "rl_loop":
        from tinker_cookbook.recipes import rl_loop

        return rl_loop.Config, rl_loop.main
    from tinker_cookbook.recipes.distillation import on_policy_distillation

    return on_policy_distillation.CLIConfig, on_policy_distillation.cli_main  # a coroutine function


def register_model(name: str, model_dir: str) -> None:
    from tinker_cookbook import model_info, tokenizer_utils

    def tokenizer():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)

    tokenizer_utils.register_tokenizer(name, tokenizer)
    known = model_info.get_model_attributes

    def attributes(model_name: str) -> model_info.ModelAttributes:
        if model_name.split(":", 1)[0] == name:
            org, version = name.split("/", 1) if "/" in name else ("local", name)
            return model_info.ModelAttributes(organization=org, version_str=version, size_str=version, is_chat=True,
                                              recommended_renderers=(RENDERER,))
        return known(model_name)

    # the cookbook's model table has no registration hook; the recipes look models up through this function
    model_info.get_model_attributes = attributes


def local_datasets(data_dir: Path, n_additions: int = 4096):
    import datasets

    def hotpot_conversations():
        rows = [json.loads(line) for line in (data_dir / "hotpotqa" / "train.jsonl").open()]
        return [{"messages": [{"role": "user", "content": r["question"]},
                              {"role": "assistant", "content": r["answer"]}]} for r in rows]

    def additions():
        rng = random.Random(0)
        rows = []
        for _ in range(n_additions):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
        return rows

    def load_dataset(path: str, *args, split: str | None = None, **kwargs):
        rows = {"HuggingFaceH4/no_robots": hotpot_conversations, "openai/gsm8k": additions,
                "zwhe99/DeepMath-103K": additions}.get(path)
        if rows is None or split not in (None, "train"):
            raise ValueError(f"no local stand-in for the dataset {path!r} split {split} (no hub access here)")
        splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows())})
        return splits if split is None else splits[split]

    datasets.load_dataset = load_dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", choices=RECIPES)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model-dir", required=True, help="the served model's directory (for its tokenizer)")
    ap.add_argument("--model-name", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="the server's base_model")
    ap.add_argument("--config", default="{}", help="the recipe's Config fields, as JSON")
    args = ap.parse_args()
    os.environ.setdefault("TINKER_API_KEY", "tml-local")  # the SDK wants a key of this form; the server reads none
    register_model(args.model_name, args.model_dir)
    local_datasets(Path(os.environ.get("SLEUTH_DATA", "../shared/data")))
    config_class, entry = recipe(args.recipe)
    result = entry(config_class(base_url=args.base_url, model_name=args.model_name, **json.loads(args.config)))
    if asyncio.iscoroutine(result):
        asyncio.run(result)


if __name__ == "__main__":
    main()
