"""Rewards and advantage estimators (step rewards, GRPO family, CW-GRPO, GEAR): see the rewards issue."""
