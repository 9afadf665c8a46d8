"""Deprecated: the former name of `sleuth.net` (free ports, health waits, body limits, local servers)."""

import warnings

from sleuth.net import free_port, in_thread, limit_body, subprocess_server, wait_healthy  # noqa: F401

warnings.warn("sleuth.serving is deprecated: import from sleuth.net", DeprecationWarning, stacklevel=2)
