"""The checks behind bench/gpu_check.py, one file per group."""
