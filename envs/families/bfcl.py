"""`bfcl:<category>` (or `bfcl:all`): BFCL v4 items (`--tasks bfcl:...`, `tasks/bfcl.py`) through the Env contract,
run and scored as `bfcl generate` + `bfcl evaluate` run and score a function-calling model behind an
OpenAI-compatible endpoint — the flow of bfcl-eval's `BaseHandler.inference_multi_turn_FC` /
`inference_single_turn_FC`, with bfcl-eval's own backends and checkers (`bfcl_checker.py`).

What the policy sees is what sleuth's gateway shows it when the official harness sends the same item: the item's
messages, the tools as BFCL compiles them for OpenAI (dots in names → underscores), in the JSON harness (the tools
and the Hermes `<tool_call>` format in the system message, as the gateway renders tools for a template that does
not), tool results as `tool` messages, the next user turn as `user` messages.

- Single-turn: one reply; its calls are the answer, scored by BFCL's AST checker (or its relevance check).
- Multi-turn: each reply's calls run on the item's own backends, built from its `initial_config`; a reply without
  a call ends the user turn; more than BFCL's MAXIMUM_STEP_LIMIT steps in one turn force-quit the item (BFCL
  scores it as failed); after the last turn the multi-turn checker replays the model's and the ground truth's calls
  and compares states and responses turn by turn. A call to a function the item does not offer is dropped, as the
  gateway drops it (so a reply of only such calls ends the turn); wrong argument names or types and backend
  exceptions reach the model as BFCL's `Error during execution: ...` results.
- miss_func: at the turn where BFCL adds the held-out functions, they join the tools and the user turn names them
  (a sleuth env cannot rewrite the system message mid-episode; the gateway re-renders it: docs/bfcl.md).

bfcl-eval pins numpy 1.26.4, tree-sitter 0.21 and the SDKs of a dozen providers (its AST checker imports every
model handler), so it has its own venv (`make bfcl`); from any other venv `make` returns a `RemoteEnv` on a
`sleuth serve env` there (`venv_server.py`). The oracle (`--policy oracle`) replays BFCL's possible answer."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from sleuth.envs.families.base import EnvFailure, Move, TextGameEnv
from sleuth.envs.families.bfcl_oracle import multi_turn_replies, single_turn_calls
from sleuth.envs.families.venv_server import ForeignVenv, remote_env
from sleuth.envs.harness import Harness
from sleuth.envs.outcome import ResetInfo
from sleuth.envs.parsers import NO_CALL, ToolCall
from sleuth.envs.tools import Tool
from sleuth.tasks.base import Task
from sleuth.tasks.bfcl import CATEGORIES, category_of, is_multi_turn
from sleuth.verifiers.base import Verdict

BFCL = ForeignVenv("bfcl", "SLEUTH_BFCL_PYTHON", ".venv-bfcl", "bfcl",
                   "bfcl-eval 2026.3.23 pins numpy 1.26.4, tree-sitter 0.21 and a dozen provider SDKs",
                   server_env={"BFCL_PROJECT_ROOT": "{workdir}",
                               "OPENAI_API_KEY": "sleuth-bfcl-scoring-makes-no-model-calls"})
# bfcl-eval's `DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC` and `MAXIMUM_STEP_LIMIT` are read from it in `begin`.


def as_tools(openai_tools: list[dict[str, Any]]) -> dict[str, Tool]:
    """BFCL's compiled tools as sleuth Tools (the harness's instructions and parser; BFCL's backends run them)."""
    return {t["function"]["name"]: Tool.run_elsewhere(t) for t in openai_tools}


class BFCLEnv(TextGameEnv):
    family = "bfcl"
    harnesses = ("json", "template")

    def __init__(self, category: str, **kwargs: Any):
        if category != "all" and category not in CATEGORIES:
            raise ValueError(f"bfcl:{category} is not a BFCL v4 category that runs here; the categories: all, "
                             f"{', '.join(CATEGORIES)}")
        kwargs.setdefault("max_turns", 1 << 16)  # BFCL's own limits end every item
        super().__init__(category, **kwargs)
        from sleuth.envs.families import bfcl_checker

        bfcl_checker.register_model()
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
            MAXIMUM_STEP_LIMIT,
        )

        self.checker, self.step_limit = bfcl_checker, MAXIMUM_STEP_LIMIT
        self.added_functions_prompt = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        self.harness = Harness(self.format)
        self.key: str | None = None
        self._verdict = Verdict(0.0, {"error": "no episode"})
        # a multi-turn item's tools and their instructions, by function names: a name's doc is fixed by its
        # backend's doc file, and the 800 multi-turn items share a few dozen tool sets
        self._tool_sets: dict[tuple[str, ...], tuple[dict[str, Tool], str]] = {}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.offered.values()]

    # -- the episode ----------------------------------------------------------------------------------
    def begin(self, task: Task, seed: int) -> Move:
        entry = task.payload.get("entry")
        if not isinstance(entry, dict) or entry.get("id") != task.id:
            raise ValueError(f"task {task.id} is not a BFCL item (`--tasks bfcl:<category>` loads them)")
        category = category_of(task.id)
        if self.env_id not in ("all", category):
            raise ValueError(f"task {task.id} is a {category} item; this env runs {self.env_id} (use bfcl:all)")
        self._release()
        # BFCL's loop extends the function list (miss_func): this episode's own list; the backends copy the rest
        self.entry = {**entry, "function": list(entry["function"])}
        self.multi = is_multi_turn(category)
        self.key = self.checker.episode_key()
        self.offered, instructions = self._tool_set(self.entry["function"])
        self.user_turn, self.steps, self.force_quit = 0, 0, False
        self._verdict = Verdict(0.0, {"category": category, "valid": False, "error_type": "cut",
                                      "error": "the episode was cut before BFCL ended it (max_turns)"})
        self.result: list[Any] = []  # single-turn: one response; multi-turn: per user turn, per step
        self.turn_responses: list[Any] = []
        if self.multi:
            self.checker.execute([], self.entry, self.key)  # the backends, built from the item's initial_config
        messages = [dict(m) for m in self.entry["question"][0]]
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        self.system_prompt = "\n\n".join(p for p in (system, instructions) if p) or None
        users = [m for m in messages if m["role"] != "system"]
        return Move(self._text(users), messages=users)

    def _tool_set(self, functions: list[dict[str, Any]]) -> tuple[dict[str, Tool], str]:
        """The tools as BFCL compiles them, and their instructions as the gateway renders a request's tools for a
        template that does not: they join the system message (an item that offers no tools gets none)."""
        key = tuple(f["name"] for f in functions) if self.multi else None
        if key is None or key not in self._tool_sets:
            offered = as_tools(self.checker.tools(functions))
            built = (offered, self.harness.parser.instructions(offered) if offered else "")
            if key is None:
                return built
            self._tool_sets[key] = built
        return self._tool_sets[key]

    def advance(self, action: str) -> Move:
        parsed = self.harness.parser.parse(action, self.offered)
        calls = [c for c in parsed.calls if c.name in self.offered]
        response: Any = [{c.name: json.dumps(c.arguments, ensure_ascii=False)} for c in calls] if calls else action
        details = {"tool_call": calls[0].to_dict() if calls else None,  # the reply's parse: `Move` fields
                   "error": _call_error(parsed.error, parsed.calls, self.offered)}
        if not self.multi:
            self.result = response
            return self._scored(details)
        self.turn_responses.append(response)
        try:
            decoded = self.checker.decode_execute(response)
        except Exception:  # BFCL: a reply it cannot decode into calls ends the user turn
            decoded = []
        if not decoded or decoded == [""]:
            return self._next_user_turn(details)
        results = self.checker.execute(decoded, self.entry, self.key)
        self.steps += 1
        if self.steps > self.step_limit:  # BFCL force-quits the item: it is scored as failed
            self.force_quit = True
            self.result.append(self.turn_responses)
            return self._scored(details, force_quit=True)
        tool_messages = [{"role": "tool", "content": r} for r in results]
        return Move(self._text(tool_messages), messages=tool_messages, **details)

    def _next_user_turn(self, details: dict[str, Any]) -> Move:
        self.result.append(self.turn_responses)
        self.turn_responses, self.steps = [], 0
        self.user_turn += 1
        if self.user_turn >= len(self.entry["question"]):
            return self._scored(details)
        messages = [dict(m) for m in self.entry["question"][self.user_turn]]
        added = self.entry.get("missed_function", {}).get(str(self.user_turn))
        if added:  # BFCL's miss_func: the held-out functions are offered from this turn on
            self.entry["function"].extend(added)
            new = as_tools(self.checker.tools(added))
            self.offered = {**self.offered, **new}
            listing = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in new.values())
            messages = [{"role": "user", "content": f"{self.added_functions_prompt}\n<tools>\n{listing}\n</tools>"}]
        return Move(self._text(messages), messages=messages, **details)

    @staticmethod
    def _text(messages: list[dict[str, Any]]) -> str:
        return "\n".join(m["content"] for m in messages)

    def _scored(self, details: dict[str, Any], force_quit: bool = False) -> Move:
        """The item's end: BFCL's checker scores it, and its score is the last step's reward (what training
        reads) as well as the verdict's."""
        try:
            outcome = self.checker.score(self.task.id, self.result, self.key)
        except Exception as e:  # BFCL's checker itself broke on this item: no score
            raise EnvFailure(f"bfcl: the checker raised on {self.task.id}: {type(e).__name__}: {e}") from e
        finally:
            self._release()
        self._verdict = Verdict(float(bool(outcome["valid"])), _details(outcome, self))
        return Move("", reward=self._verdict.score, terminated=True, details={"force_quit": True} if force_quit else {},
                    **details)

    def verdict(self) -> Verdict:
        return self._verdict

    def _release(self) -> None:
        if self.key is not None:
            self.checker.release(self.key)

    def close(self) -> None:
        self._release()

    # -- the oracle -------------------------------------------------------------------------------------
    @classmethod
    def oracle(cls, task: Task, turn: int, start: ResetInfo) -> list[ToolCall]:
        """BFCL's possible answer as replies (`bfcl_oracle.py`)."""
        truth, entry = task.payload.get("ground_truth"), task.payload["entry"]
        category = category_of(task.id)
        if not is_multi_turn(category):
            language = {"simple_java": "java", "simple_javascript": "javascript",
                        "live_relevance": "relevance"}.get(category, "python")
            return single_turn_calls(truth, task.payload.get("source_types"), language, start.tools)
        functions = {f["name"]: f for f in entry["function"]}
        for added in entry.get("missed_function", {}).values():
            functions.update({f["name"]: f for f in added})
        replies = multi_turn_replies(truth, functions)
        return replies[turn] if turn < len(replies) else []


def _call_error(error: str | None, calls: list[ToolCall], offered: dict[str, Tool]) -> str | None:
    if error and error != NO_CALL:
        return error
    unknown = sorted({c.name for c in calls} - set(offered))
    return f"no tool is named {', '.join(unknown)} (dropped)" if unknown else None


def _details(outcome: dict[str, Any], env: BFCLEnv) -> dict[str, Any]:
    """The checker's outcome, without the echoed prompt and answers: valid, error type and message, and for a
    multi-turn item the turn reached, the steps of each turn and whether BFCL force-quit it."""
    error = outcome.get("error")
    if isinstance(error, dict):  # multi-turn: {error_message, error_type, details}
        message, error_type = error.get("error_message"), error.get("error_type")
    else:
        message, error_type = error, outcome.get("error_type")
    details: dict[str, Any] = {"category": category_of(env.task.id), "valid": bool(outcome["valid"])}
    if not outcome["valid"]:
        details["error_type"] = error_type or ""
        details["error"] = json.dumps(message, ensure_ascii=False, default=str)[:2000]
    if env.multi:
        details.update(user_turns=len(env.result), turns=len(env.entry["question"]), force_quit=env.force_quit,
                       steps_per_turn=[len(t) for t in env.result])
    return details


def env_ids() -> list[str]:
    return ["all", *CATEGORIES]


def in_process() -> bool:
    """Whether bfcl-eval runs here: its checker imports every provider SDK it pins, which only its own venv has."""
    return all(importlib.util.find_spec(m) is not None for m in ("bfcl_eval", "tree_sitter", "cohere", "qwen_agent"))


def make(category: str, **env_args: Any) -> Any:
    if in_process():
        return BFCLEnv(category, **env_args)
    return remote_env(BFCL, category, env_args, timeout=120.0)
