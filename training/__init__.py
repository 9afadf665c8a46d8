"""Training: losses, the RL trainer loop, supervised fine-tuning and the DeepSpeed ZeRO engine (docs/training.md)."""
