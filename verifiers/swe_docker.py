"""Official SWE-bench instances (e.g. `../shared/data/swebench_lite/test.jsonl`) run in SWE-bench's own
Docker images through its own harness (`python -m swebench.harness.run_evaluation`): each instance needs
its upstream repository at `base_commit` with a pinned environment, which only those images provide.
That needs a Docker daemon, network access to pull the images, and the `swebench` package
(`pip install 'sleuth[swebench]'`). Where any is missing the backend says which, instead of scoring."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from sleuth.verifiers.base import CannotScore, Verdict


def image_name(instance_id: str, namespace: str = "swebench") -> str:
    """The official per-instance evaluation image (SWE-bench writes '__' as '_1776_' in image tags)."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def missing_requirements() -> list[str]:
    """What this machine lacks to run SWE-bench instances (empty: it can)."""
    missing = []
    docker = shutil.which("docker")
    if docker is None:
        missing.append("the docker command (install Docker Engine)")
    else:
        try:
            ok = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            missing.append("a running Docker daemon that this user may reach (docker info failed)")
    if importlib.util.find_spec("swebench") is None:
        missing.append("the swebench package (pip install 'sleuth[swebench]')")
    return missing


class DockerBackend:
    def __init__(self, namespace: str = "swebench", timeout_s: int = 1800):
        self.namespace = namespace
        self.timeout_s = timeout_s

    def verify(self, rec: dict[str, Any], diff: str) -> Verdict:
        missing = missing_requirements()
        if missing:
            raise CannotScore(
                f"{rec.get('instance_id')} is an official SWE-bench instance: it runs in the image "
                f"{image_name(str(rec.get('instance_id')), self.namespace)} with SWE-bench's harness, and this "
                f"machine lacks {'; '.join(missing)}. Network access to Docker Hub is needed to pull the image.")
        if not diff.strip():
            return Verdict(0.0, {"instance_id": rec["instance_id"], "error": "empty_patch", "resolved": False})
        return self._run_harness(rec, diff)

    def _run_harness(self, rec: dict[str, Any], diff: str) -> Verdict:
        run_id = f"sleuth-{uuid.uuid4().hex[:8]}"
        iid = rec["instance_id"]
        with tempfile.TemporaryDirectory(prefix="sleuth-swebench-") as tmp:
            tmpdir = Path(tmp)
            (tmpdir / "instances.jsonl").write_text(json.dumps(rec) + "\n")
            (tmpdir / "preds.jsonl").write_text(json.dumps(
                {"instance_id": iid, "model_name_or_path": "sleuth", "model_patch": diff}) + "\n")
            cmd = ["python", "-m", "swebench.harness.run_evaluation", "--dataset_name", str(tmpdir / "instances.jsonl"),
                   "--predictions_path", str(tmpdir / "preds.jsonl"), "--instance_ids", iid, "--run_id", run_id,
                   "--max_workers", "1", "--namespace", self.namespace, "--timeout", str(self.timeout_s)]
            proc = subprocess.run(cmd, cwd=tmpdir, capture_output=True, text=True, timeout=self.timeout_s + 600,
                                  env={**os.environ})
            report = tmpdir / "logs" / "run_evaluation" / run_id / "sleuth" / iid / "report.json"
            if not report.is_file():
                raise CannotScore(f"SWE-bench's harness wrote no report for {iid} (exit {proc.returncode}): "
                                  f"{(proc.stderr or proc.stdout)[-800:]}")
            result = json.loads(report.read_text()).get(iid, {})
        resolved = bool(result.get("resolved"))
        return Verdict(1.0 if resolved else 0.0, {"instance_id": iid, "resolved": resolved, "backend": "docker",
                                                   "image": image_name(iid, self.namespace),
                                                   "patch_applied": result.get("patch_successfully_applied"),
                                                   "tests_status": result.get("tests_status", {})})
