"""No layer kernels are fetched from the Hugging Face hub at run time. transformers ≥ 5.24 turns its `kernels`
integration on by default; on a CUDA device `.train()` then downloads kernels (an offline GPU machine failed
every training path on it), so every causal LM sleuth loads goes through `load_causal_lm`, which turns it off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_load_causal_lm_keeps_hub_kernels_off_through_train_and_eval(tiny_model_dir):
    pytest.importorskip("kernels")  # a dependency of transformers ≥ 5.24: what turns the integration on
    from transformers import AutoModelForCausalLM

    from sleuth.agents.policies.models import load_causal_lm

    assert AutoModelForCausalLM.from_pretrained(tiny_model_dir).use_kernels  # the default this guards against
    model = load_causal_lm(tiny_model_dir)
    for switch in (model.train, model.eval):
        switch()
        assert model.use_kernels is False and model.kernels_mode is None


def test_no_module_loads_a_model_past_load_causal_lm():
    """Any `from_pretrained` of a model outside agents/policies/models.py would bring the hub kernels back (tests load
    tiny models on the CPU, where none apply, and are not scanned)."""
    offenders = []
    tops = [p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in ("tests", "runs")]
    for path in [*ROOT.glob("*.py"), *(f for top in tops for f in top.rglob("*.py"))]:
        rel = path.relative_to(ROOT)
        if rel == Path("agents/policies/models.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"AutoModel\w*\.from_pretrained\(", line) and "use_kernels=False" not in line:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "load models with sleuth.agents.policies.models.load_causal_lm:\n" + "\n".join(offenders)
