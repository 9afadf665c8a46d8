"""Rollout engines as the trainer sees them: a `Policy` for the agent loop plus a verified weight sync."""
