"""The agent loop: episodes of many envs against one policy, scheduled, each env call on a watchdog thread."""
