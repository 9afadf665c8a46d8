"""The checks behind experiments/gpu_check.py, one file per group."""
