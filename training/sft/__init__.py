"""Supervised fine-tuning on token-exact trajectories: data sources and the SFT loop."""
