"""Training: losses, the trainer loop and the DeepSpeed ZeRO engine: see the training issue."""
