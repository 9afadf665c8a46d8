"""bfcl-eval's own execution and scoring, called as `bfcl generate` and `bfcl evaluate` call them for a model served
over an OpenAI-compatible chat-completions endpoint in function-calling mode. Nothing here re-implements BFCL: the
calls run through `execute_multi_turn_func_call`, an item is scored by the per-entry functions of bfcl-eval's
`eval_runner` (`_evaluate_single_ast_entry`, `_evaluate_single_relevance_entry`, `_evaluate_single_multi_turn_entry`)
against the prompt entries and possible answers its own loaders read, with its OpenAI chat-completions handler
decoding the model's calls. Imported only where bfcl-eval and all its dependencies are installed (`.venv-bfcl`).

The model is registered as `sleuth-policy-FC` (the way BFCL adds a model: an entry of `MODEL_CONFIG_MAPPING`), with
BFCL's `OpenAICompletionsHandler` in function-calling mode and `underscore_to_dot` (OpenAI tool names cannot hold
a dot, so `math.factorial` is offered as `math_factorial`), so the official harness run against sleuth's gateway
(`experiments/bfcl_parity.py`) and this env score one model the same way.

bfcl-eval keeps a multi-turn item's backend instances in a module-global dict keyed by (model name, item id); each
episode here runs under a model name of its own (so the G episodes of a GRPO group never share a file system), and
`release` drops its instances when the episode ends."""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Any

MODEL = "sleuth-policy-FC"  # BFCL's registry name for the served policy
MODEL_NAME = "sleuth-policy"  # the `model` field of its requests


def _prepare() -> None:
    """bfcl-eval writes `result/`, `score/` and lock files under $BFCL_PROJECT_ROOT (default: beside site-packages),
    and its handler's OpenAI client needs a key even though it never calls out from here."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "sleuth" / "bfcl"))
    os.environ.setdefault("OPENAI_API_KEY", "sleuth-bfcl-scoring-makes-no-model-calls")


def register_model() -> None:
    """Add `sleuth-policy-FC` to BFCL's model registry (idempotent)."""
    _prepare()
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING, ModelConfig
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler

    MODEL_CONFIG_MAPPING.setdefault(MODEL, ModelConfig(
        model_name=MODEL_NAME, display_name="sleuth policy (FC)", url="https://github.com/sleuth", org="sleuth",
        license="Apache-2.0", model_handler=OpenAICompletionsHandler, is_fc_model=True, underscore_to_dot=True))


@functools.cache
def handler() -> Any:
    register_model()
    from bfcl_eval.eval_checker.eval_runner import get_handler

    return get_handler(MODEL)


@functools.cache
def _prompt_entries(category: str) -> dict[str, dict[str, Any]]:
    """The entries `bfcl evaluate` scores against (without the language hints generation adds)."""
    from bfcl_eval.utils import load_dataset_entry

    return {e["id"]: e for e in load_dataset_entry(category, include_prereq=False,
                                                   include_language_specific_hint=False)}


@functools.cache
def _possible_answers(category: str) -> dict[str, Any]:
    from bfcl_eval.utils import is_relevance_or_irrelevance, load_ground_truth_entry

    if is_relevance_or_irrelevance(category):
        return {}
    return {e["id"]: e["ground_truth"] for e in load_ground_truth_entry(category)}


def tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's function docs as the OpenAI tools its chat-completions handler sends (`_compile_tools`)."""
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool

    return convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)


def episode_key() -> str:
    """A model name of this episode's own, for bfcl-eval's instance registry."""
    return f"sleuth_{uuid.uuid4().hex}"


def execute(calls: list[str], entry: dict[str, Any], key: str) -> list[str]:
    """Run decoded calls (`cd(folder='document')`) on the item's backends as `bfcl generate` does."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    category = entry["id"].rsplit("_", 1)[0]
    results, _ = execute_multi_turn_func_call(calls, entry.get("initial_config", {}), entry["involved_classes"], key,
                                              entry["id"], long_context="long_context" in category,
                                              is_evaL_run=False)
    return results


def decode_execute(responses: Any) -> list[str]:
    """One step's model responses as BFCL's handler decodes them for execution (raises where BFCL's decoding
    fails: a reply without calls ends the user turn)."""
    return handler().decode_execute(responses, has_tool_call_tag=False)


def release(key: str) -> None:
    """Drop every backend instance bfcl-eval registered under this episode's model name."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    registry = vars(multi_turn_utils)
    for name in [n for n in registry if n.startswith(key)]:
        registry.pop(name, None)


def score(item_id: str, result: Any, key: str) -> dict[str, Any]:
    """BFCL's per-entry evaluation of `result` (the model's responses in the raw form `bfcl generate` stores: one
    response for a single-turn item; per user turn, per step, for a multi-turn one)."""
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.utils import is_java, is_js, is_multi_turn, is_relevance_or_irrelevance

    category = item_id.rsplit("_", 1)[0]
    entries = _prompt_entries(category)
    if item_id not in entries:
        raise KeyError(f"{item_id} is not an item of BFCL v4 {category}")
    prompt = dict(entries[item_id])
    if is_relevance_or_irrelevance(category):
        return eval_runner._evaluate_single_relevance_entry(handler(), item_id, result, prompt, MODEL, category)
    truth = _possible_answers(category)[item_id]
    if is_multi_turn(category):
        try:
            return eval_runner._evaluate_single_multi_turn_entry(handler(), item_id, result, truth, prompt, key,
                                                                 category)
        finally:
            release(key)
    language, form = ((Language.JAVA, ReturnFormat.JAVA) if is_java(category) else
                      (Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT) if is_js(category) else
                      (Language.PYTHON, ReturnFormat.PYTHON))
    return eval_runner._evaluate_single_ast_entry(handler(), item_id, result, truth, prompt, MODEL, category,
                                                  language=language, return_format=form, has_tool_call_tag=False)


def official_cli() -> None:
    """bfcl-eval's own `bfcl` command (`generate`, `evaluate`, ...) with the served policy registered, so the
    official harness runs against an OpenAI-compatible endpoint (`OPENAI_BASE_URL`, e.g. sleuth's gateway) as
    `--model sleuth-policy-FC`: `python -m sleuth.envs.families.bfcl_checker generate --model sleuth-policy-FC ...`."""
    register_model()
    from bfcl_eval.__main__ import cli

    cli()


if __name__ == "__main__":
    official_cli()
