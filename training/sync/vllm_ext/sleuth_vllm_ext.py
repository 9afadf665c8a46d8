"""A vLLM worker extension that loads new weights from a safetensors file.

Imported inside vLLM's worker processes (its own virtualenv), so it imports nothing from sleuth. The
trainer writes the weights to a file (on /dev/shm where it exists) and calls `load_weights_from` through
the server's `/collective_rpc` endpoint (VLLM_SERVER_DEV_MODE=1); NCCL broadcast is the GPU-cluster
alternative and is not needed for one machine."""

from __future__ import annotations


class WeightLoader:
    def load_weights_from(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)
        runner = self.model_runner  # type: ignore[attr-defined]
        if hasattr(runner, "reload_weights"):
            # In place, and re-running each layer's post-load processing: the CPU backend repacks linear
            # weights after loading, so a plain `model.load_weights` finds emptied parameters.
            runner.reload_weights(weights_iterator=iter(weights.items()))
        else:
            runner.model.load_weights(weights=weights.items())
        self._retie(runner.model)
        return len(weights)

    @staticmethod
    def _retie(model) -> None:
        """A tied LM head shares the embedding's weight but keeps its own post-load state (on CPU, a oneDNN
        handle packed from the old weight): re-tie it and redo its post-load processing."""
        config = getattr(model, "config", None)
        head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        if not (getattr(config, "tie_word_embeddings", False) and head is not None and embed is not None):
            return
        if head.weight is not embed.weight:
            head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
