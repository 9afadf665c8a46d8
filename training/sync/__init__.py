"""Weight sync: torch.distributed streams between trainer and rollout workers, and vLLM's weight loader."""
