"""On-policy distillation: teachers (in process or on a server) and their per-token signal."""
