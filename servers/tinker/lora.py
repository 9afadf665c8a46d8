"""One base model and the LoRA adapters of every Tinker training client on it (peft's multi-adapter model), each
with its own AdamW; sampler snapshots are frozen adapters of the same model, loaded from disk on demand.

Why not sleuth's DeepSpeed engine: it wraps one model with one optimizer, and Tinker clients are many adapters
that share one base model and step independently; ZeRO's sharding buys nothing for LoRA states in one process.
Full fine-tuning would need one engine (`training/zero.py`, ZeRO) per client, that is one model copy each.
Everything here runs on one thread (the server's worker): the active adapter is process-wide state."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sleuth.agents.policies.models import load_causal_lm
from sleuth.servers.tinker.losses import REQUIRED, LossBatch, LossInputError, check_loss, loss_sum
from sleuth.servers.tinker.wire import WireDatum
from sleuth.training.rl.losses import scored_logprobs

LORA_ALPHA = 32  # fixed, so the effective scale alpha/rank falls as the rank grows (Tinker's LoRA works so)
MICRO_BATCH_TOKENS = 4096  # datums are packed into forwards of at most this many padded tokens
SAMPLERS_LOADED = 4  # sampler snapshots kept as adapters in memory; older ones are reloaded from disk when asked
ATTN, MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]


@dataclass
class AdapterSpec:
    base_model: str
    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def targets(self) -> list[str]:
        return (ATTN if self.train_attn else []) + (MLP if self.train_mlp else []) + \
            (["lm_head"] if self.train_unembed else [])


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool


class Sampler(Protocol):
    """What samples for the server: the trainer's own module (`LoraModels`) or a vLLM server (`VLLMSampler`)."""

    def sample(self, weights: Path | None, prompts: list[list[int]], ns: list[int], max_tokens: int | None,
               temperature: float, top_p: float, top_k: int, stop: list[int] | list[str] | None,
               seed: int | None) -> list[list[Sampled]]:
        """`ns[i]` samples of each prompt `prompts[i]`, as one batch where the sampler can."""
        ...

    def prompt_logprobs(self, weights: Path | None, prompt: list[int], topk: int) -> tuple[np.ndarray, tuple | None]:
        ...

    def refuses(self, spec: AdapterSpec) -> str | None: ...


class LoraModels:
    def __init__(self, model_dir: str, served_name: str, dtype: torch.dtype = torch.float32,
                 aliases: tuple[str, ...] = ()):
        from transformers import AutoTokenizer

        self.served_name = served_name
        self.aliases = tuple(a for a in aliases if a != served_name)  # other names clients may ask for it by
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.base = load_causal_lm(model_dir, dtype)
        self.base.requires_grad_(False)
        self.vocab = int(self.base.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(self.base.config, "max_position_embeddings", 8192))
        self.peft = None  # peft's PeftModel, made with the first adapter
        self.specs: dict[str, AdapterSpec] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.samplers: list[str] = []  # loaded sampler adapters, oldest first
        self._names: dict[str, str] = {}  # client model id or sampler dir → adapter name (no dots)
        self._made = 0  # adapters made so far: names are never reused
        self._merged: torch.nn.Module | None = None  # `merged`'s copy of the model, and whose weights it holds
        self._merged_from: Path | None = None

    def serves(self, name: str) -> bool:
        """Whether `name` is this base model: its served name, or the name the server was started with (`--model
        smollm2`), which is what a user who typed it passes as `base_model`."""
        return name == self.served_name or name in self.aliases

    # ---- adapters -------------------------------------------------------------------------------------------
    def _adapter(self, key: str, spec: AdapterSpec) -> str:
        from peft import LoraConfig, get_peft_model

        self._made += 1
        name = self._names[key] = f"a{self._made}"
        cfg = LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, target_modules=spec.targets(), lora_dropout=0.0)
        if self.peft is None:
            self.peft = get_peft_model(self.base, cfg, adapter_name=name)
        else:
            self.peft.add_adapter(name, cfg)
        self.specs[name] = spec
        return name

    def _params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if f".{name}." in n]

    def create(self, model_id: str, spec: AdapterSpec, seed: int | None = None) -> None:
        if seed is not None:
            torch.manual_seed(seed)  # LoRA's A matrices are drawn at random: the seed makes a client reproducible
        name = self._adapter(model_id, spec)
        self.peft.set_adapter(name)
        self.optimizers[name] = torch.optim.AdamW(self._params(name), lr=1e-4)

    def client_spec(self, model_id: str) -> AdapterSpec | None:
        name = self._names.get(model_id)
        return self.specs[name] if name in self.optimizers else None

    def _client(self, model_id: str) -> str:
        name = self._names.get(model_id)
        if name is None or name not in self.optimizers:
            raise LossInputError(f"no training client {model_id!r} on this server (create it first)")
        self.peft.set_adapter(name)
        return name

    # ---- training -------------------------------------------------------------------------------------------
    def forward_backward(self, model_id: str, data: list[WireDatum], loss_fn: str, config: dict[str, float | str],
                         forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum the target tokens' logprobs, and `loss:sum`; gradients accumulate until `optim_step`."""
        check_loss(loss_fn, config)
        for i, d in enumerate(data):
            self._check_datum(i, d, loss_fn)
        self._client(model_id)
        self.peft.train()
        outputs: list[dict[str, np.ndarray]] = []
        total = 0.0
        for part in self._micro_batches(data):
            with torch.set_grad_enabled(not forward_only):
                batch = self._loss_batch(part)
                loss = loss_sum(loss_fn, config, batch)
                if not forward_only:
                    loss.backward()
            total += float(loss.detach())
            lp = batch.target_logprobs.detach()
            outputs += [{"logprobs": lp[b, :len(d.tokens)].numpy().astype(np.float32)} for b, d in enumerate(part)]
        return outputs, {"loss:sum": total}

    def _check_datum(self, i: int, d: WireDatum, loss_fn: str) -> None:
        n = len(d.tokens)
        if n == 0:
            raise LossInputError(f"datum {i}: empty model_input")
        missing = [k for k in REQUIRED[loss_fn] if k not in d.inputs]
        if missing:
            raise LossInputError(f"datum {i}: {loss_fn} needs loss_fn_inputs {', '.join(missing)}")
        unread = sorted(set(d.inputs) - set(REQUIRED[loss_fn]))
        if unread:  # e.g. per-token clip thresholds: silently ignoring them would train another objective
            raise LossInputError(f"datum {i}: loss_fn_inputs {unread} are not read by {loss_fn} here (it reads "
                                 f"{', '.join(REQUIRED[loss_fn])}; clip thresholds go in loss_fn_config)")
        for k, v in d.inputs.items():
            if v.shape != (n,):
                raise LossInputError(f"datum {i}: loss_fn_inputs[{k!r}] has shape {list(v.shape)} but model_input "
                                     f"has {n} tokens: each input holds one value per model_input position")
        for what, ids in (("model_input", d.tokens), ("target_tokens", d.inputs["target_tokens"])):
            if ids.min() < 0 or ids.max() >= self.vocab:
                raise LossInputError(f"datum {i}: {what} holds ids outside the vocabulary [0, {self.vocab})")

    @staticmethod
    def _micro_batches(data: list[WireDatum]) -> list[list[WireDatum]]:
        parts: list[list[WireDatum]] = [[]]
        for d in data:
            width = max([len(d.tokens)] + [len(x.tokens) for x in parts[-1]])
            if parts[-1] and width * (len(parts[-1]) + 1) > MICRO_BATCH_TOKENS:
                parts.append([])
            parts[-1].append(d)
        return parts

    def _loss_batch(self, part: list[WireDatum]) -> LossBatch:
        width = max(len(d.tokens) for d in part)

        def padded(key: str | None, dtype: torch.dtype) -> torch.Tensor:
            out = torch.zeros(len(part), width, dtype=dtype)
            for b, d in enumerate(part):
                src = d.tokens if key is None else d.inputs[key]
                out[b, :len(src)] = torch.from_numpy(np.asarray(src)).to(dtype)
            return out

        ids, targets = padded(None, torch.long), padded("target_tokens", torch.long)
        mask = torch.zeros(len(part), width)
        for b, d in enumerate(part):
            mask[b, :len(d.tokens)] = 1
        logits = self.peft(input_ids=ids, attention_mask=mask.long()).logits
        # scored_logprobs reads position t's target at t + 1 of its id tensor (next-token alignment): the targets
        # are shifted right by one column (column 0 is masked out and never scored)
        shifted_ids = torch.cat([torch.zeros(len(part), 1, dtype=torch.long), targets], dim=1)
        shifted_mask = torch.cat([torch.zeros(len(part), 1), mask], dim=1)
        lp, _ = scored_logprobs(logits[mask.bool()], shifted_ids, shifted_mask)
        opt = {k: padded(k, torch.float32) if k in part[0].inputs else None
               for k in ("weights", "logprobs", "advantages")}
        return LossBatch(lp[:, 1:], mask, opt["weights"], opt["logprobs"], opt["advantages"])

    def optim_step(self, model_id: str, learning_rate: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, grad_clip_norm: float) -> dict[str, float]:
        name = self._client(model_id)
        opt = self.optimizers[name]
        params = self._params(name)
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip_norm if grad_clip_norm > 0 else float("inf"))
        for group in opt.param_groups:
            group.update(lr=learning_rate, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"grad_norm:mean": float(norm), "learning_rate:mean": learning_rate}

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def save(self, model_id: str, out: Path, optimizer: bool) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        name = self._client(model_id)
        tmp = out.with_name(out.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        # the LoRA tensors only: with lm_head among the targets peft would also save the (frozen) output embedding
        state = get_peft_model_state_dict(self.peft, adapter_name=name, save_embedding_layers=False)
        state = {k: v.detach().contiguous() for k, v in state.items()}
        save_file(state, tmp / "adapter.safetensors")
        if optimizer:
            torch.save(self.optimizers[name].state_dict(), tmp / "optimizer.pt")
        (tmp / "spec.json").write_text(json.dumps(asdict(self.specs[name])))
        tmp.replace(out)  # a checkpoint is complete or absent, never half-written

    @staticmethod
    def spec_of(path: Path) -> AdapterSpec:
        return AdapterSpec(**json.loads((path / "spec.json").read_text()))

    def load(self, model_id: str, path: Path, optimizer: bool) -> None:
        """Into an existing client (its adapter must have the checkpoint's shape), or a new one made from it."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        spec = self.spec_of(path)
        if model_id not in self._names:
            self.create(model_id, spec)
        name = self._client(model_id)
        if self.specs[name] != spec:
            raise LossInputError(f"checkpoint {path.name} is a rank-{spec.rank} adapter on {spec.targets()}; client "
                                 f"{model_id} is rank {self.specs[name].rank} on {self.specs[name].targets()}")
        set_peft_model_state_dict(self.peft, load_file(path / "adapter.safetensors"), adapter_name=name)
        if optimizer:
            if not (path / "optimizer.pt").exists():
                raise LossInputError(f"checkpoint {path.name} holds no optimizer state (saved for a sampler)")
            self.optimizers[name].load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))

    # ---- sampling -------------------------------------------------------------------------------------------
    def _sampler(self, path: Path | None) -> str | None:
        """The adapter holding the sampler weights at `path` (None: the base model), loaded if it is not."""
        if path is None:
            return None
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        key = str(path)
        if key in self.samplers:
            self.samplers.remove(key)
        else:
            if len(self.samplers) >= SAMPLERS_LOADED:
                oldest = self.samplers.pop(0)
                self.peft.delete_adapter(self._names.pop(oldest))
            name = self._adapter(key, self.spec_of(path))
            set_peft_model_state_dict(self.peft, load_file(path / "adapter.safetensors"), adapter_name=name)
        self.samplers.append(key)
        return self._names[key]

    @torch.no_grad()
    def sample(self, weights: Path | None, prompts: list[list[int]], ns: list[int], max_tokens: int | None,
               temperature: float, top_p: float, top_k: int, stop: list[int] | list[str] | None,
               seed: int | None) -> list[list[Sampled]]:
        """One generation over every row (each prompt `ns[i]` times, left-padded to the longest)."""
        from transformers import LogitsProcessorList

        from sleuth.agents.policies.hf import TokenSampler

        for prompt in prompts:
            self.check_prompt(prompt)
        width = max(len(p) for p in prompts)
        room = self.max_context - width
        if max_tokens is not None and max_tokens > room:
            raise LossInputError(f"max_tokens {max_tokens} + {width} prompt tokens exceed the model's context "
                                 f"of {self.max_context}")
        stop_ids = [self.tokenizer.eos_token_id] if stop is None else [s for s in stop if isinstance(s, int)]
        stop_strs = [s for s in (stop or []) if isinstance(s, str)]
        recorder = TokenSampler(temperature, top_p, max(top_k, 0))
        kwargs = dict(max_new_tokens=max_tokens if max_tokens is not None else room, do_sample=False,
                      eos_token_id=stop_ids or None, logits_processor=LogitsProcessorList(
                          [recorder]), pad_token_id=self.tokenizer.pad_token_id or 0)
        if stop_strs:
            kwargs.update(stop_strings=stop_strs, tokenizer=self.tokenizer)
        # n rows per prompt (not num_return_sequences, which greedy decoding refuses), left-padded
        rows = [p for p, n in zip(prompts, ns, strict=True) for _ in range(n)]
        ids = torch.full((len(rows), width), kwargs["pad_token_id"], dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(rows):
            ids[r, width - len(p):], mask[r, width - len(p):] = torch.tensor(p), 1
        with self.merged(weights) as model:
            if seed is not None:  # after loading the sampler adapter, whose LoRA init draws random numbers
                torch.manual_seed(seed)
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        new = out[:, width:]
        lps = recorder.finish(out[:, -1])
        cut = [self._cut(new[r].tolist(), lps[r].tolist(), stop_ids, stop_strs) for r in range(len(rows))]
        ends = np.cumsum([0, *ns])
        return [cut[ends[i]:ends[i + 1]] for i in range(len(ns))]

    def _cut(self, toks: list[int], lps: list[float], stop_ids: list[int], stop_strs: list[str]) -> Sampled:
        """A row up to and including its first stop token or the token that completes a stop string."""
        for k, t in enumerate(toks):
            if t in stop_ids or (stop_strs and any(s in self.tokenizer.decode(toks[:k + 1]) for s in stop_strs)):
                return Sampled(toks[:k + 1], lps[:k + 1], True)
        return Sampled(toks, lps[:len(toks)], False)

    @torch.no_grad()
    def prompt_logprobs(self, weights: Path | None, prompt: list[int], topk: int) -> tuple[np.ndarray, tuple | None]:
        """log p(prompt[i] | prompt[:i]) per position (NaN at 0, which nothing predicts) and, for k > 0, each
        position's k most likely tokens as (ids, logprobs) of shape (len(prompt), k)."""
        self.check_prompt(prompt)
        ids = torch.tensor([prompt])
        with self.merged(weights) as model:
            logsm = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        lp = np.full(len(prompt), np.nan, dtype=np.float32)
        lp[1:] = logsm.gather(-1, ids[0, 1:, None])[:, 0].numpy()
        if topk <= 0:
            return lp, None
        top = torch.topk(logsm, min(topk, self.vocab), dim=-1)
        tok_ids = np.zeros((len(prompt), topk), dtype=np.int32)
        tok_lps = np.full((len(prompt), topk), -99999.0, dtype=np.float32)
        tok_ids[1:, :top.indices.shape[1]] = top.indices.numpy()
        tok_lps[1:, :top.values.shape[1]] = top.values.numpy()
        return lp, (tok_ids, tok_lps)

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise LossInputError("the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab:
            raise LossInputError(f"the prompt holds ids outside the vocabulary [0, {self.vocab})")
        if len(prompt) >= self.max_context:
            raise LossInputError(f"the prompt's {len(prompt)} tokens fill the model's context of {self.max_context}")

    @contextlib.contextmanager
    def computing_with(self, weights: Path | None) -> Iterator[torch.nn.Module]:
        """The model, computing with the sampler weights at `weights` (None: the base model) inside the block."""
        name = self._sampler(weights)
        if self.peft is None:
            yield self.base
            return
        self.peft.eval()
        if name is None:
            with self.peft.disable_adapter():
                yield self.peft
        else:
            self.peft.set_adapter(name)
            yield self.peft

    @contextlib.contextmanager
    def merged(self, weights: Path | None) -> Iterator[torch.nn.Module]:
        """A plain copy of the model holding the sampler weights at `weights` merged in (LoRA folded into each
        base weight, as a sync to a rollout engine sends them): generation through peft's unmerged layers costs
        one more small module call per adapted layer and token, most of a CPU decode step. One set of weights
        is held at a time; naming another reloads it."""
        if self._merged is None:
            self._merged = load_causal_lm(self.model_dir, self.base.dtype).eval()
            head = self._merged.get_output_embeddings()
            if head.weight is self._merged.get_input_embeddings().weight:  # an lm_head adapter merges into the head
                head.weight = torch.nn.Parameter(head.weight.detach().clone())  # alone: the copy's are untied
                self._merged.config.tie_word_embeddings = False
        if self._merged_from != weights:
            from sleuth.training.zero import full_weights

            with self.computing_with(weights) as model, full_weights(model) as plain:
                self._merged.load_state_dict(plain, strict=True)
            self._merged_from = weights
        yield self._merged

    def refuses(self, spec: AdapterSpec) -> str | None:
        """Why this sampler cannot serve adapters of `spec` (None: it can serve any)."""
        return None
