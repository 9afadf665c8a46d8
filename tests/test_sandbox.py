"""The hostile-input suite: each program must be contained, reported, and leave the machine as it was."""

import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from sleuth.sandbox import Limits, Sandbox, SandboxPool

REPO = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(not Sandbox().bwrap, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def sb():
    return Sandbox(Limits(wall_s=4, cpu_s=2, memory_mb=512, processes=16, file_mb=8, output_bytes=4000))


def leftover(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_plain_program_runs(sb):
    r = sb.run_python("import sys\nprint('hi'); print('err', file=sys.stderr)")
    assert r.ok and r.stdout == "hi\n" and r.stderr == "err\n" and r.exit_code == 0


def test_infinite_loop_is_stopped(sb):
    r = sb.run_python("while True: pass")
    assert r.status in ("cpu", "timeout") and r.wall_s < 6


def test_sleeping_program_hits_the_wall_clock(sb):
    r = sb.run_python("import time; time.sleep(60)")
    assert r.status == "timeout" and 3.9 < r.wall_s < 6


def test_fork_bomb_is_contained_and_cleaned_up(sb):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    code = f"import os\n# {marker}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = sb.run_python(code)
    assert r.status in ("timeout", "cpu", "killed", "error")
    assert leftover(marker) == []


def test_huge_allocation_is_a_memory_failure(sb):
    r = sb.run_python("x = bytearray(10 * 1024 ** 3)")
    assert r.status == "memory" and "MemoryError" in r.stderr


def test_a_gigabyte_of_stdout_is_cut(sb):
    r = sb.run_python("import sys\nb = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(b)")
    assert r.status == "output_limit" and r.truncated
    assert len(r.stdout) < 4200 and "more bytes cut" in r.stdout


def test_writes_outside_the_working_dir_fail(sb, tmp_path):
    target = REPO / f"pwned-{uuid.uuid4().hex[:6]}"
    code = (f"for p in [{str(target)!r}, '/etc/pwned', '/usr/pwned', '../pwned']:\n"
            "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
            "    except OSError as e:\n        print('denied', p)\n"
            "open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())")
    r = sb.run_python(code)
    assert "wrote" not in r.stdout and r.stdout.count("denied") == 4 and r.stdout.endswith("ok\n")
    assert not target.exists() and not Path("/etc/pwned").exists()


@needs_bwrap
def test_secrets_outside_the_sandbox_are_unreadable(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-42")
    code = (f"import os\nfor p in [{str(secret)!r}, '/etc/shadow', '/root/.bashrc', {str(REPO / 'README.md')!r}]:\n"
            "    try:\n        print(open(p).read()[:40])\n    except OSError as e:\n        print(type(e).__name__)")
    r = sb.run_python(code)
    assert "TOPSECRET" not in r.stdout and "sleuth" not in r.stdout
    assert r.stdout.split() == ["FileNotFoundError", "PermissionError", "FileNotFoundError", "FileNotFoundError"]


@needs_bwrap
def test_network_is_unreachable(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    got: list = []

    def accept():
        try:
            got.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    r = sb.run_python(f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
                      "print('connected')")
    t.join()
    server.close()
    assert got == [] and "connected" not in r.stdout and r.status == "error"


def test_killing_its_parent_does_not_hurt_us(sb):
    r = sb.run_python("import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                      "except OSError as e:\n    print(type(e).__name__)")
    assert os.getpid() > 0  # we are still here
    assert r.status in ("ok", "error", "killed")


def test_background_processes_are_gone_after_the_run(sb):
    marker = f"299.{uuid.uuid4().int % 10**6}"
    r = sb.run_python(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
                      "print('spawned')")
    assert r.stdout == "spawned\n"
    assert leftover(f"sleep {marker}") == []


def test_files_are_placed_and_paths_cannot_escape(sb):
    r = sb.run_python("print(open('data/x.txt').read())", files={"data/x.txt": "payload"})
    assert r.stdout == "payload\n"
    with pytest.raises(ValueError, match="outside"):
        sb.run_python("", files={"../escape.txt": "x"})


def test_fallback_without_bwrap_warns_and_still_limits():
    fb = Sandbox(Limits(wall_s=4, memory_mb=256), isolation="rlimits")
    r = fb.run_python("x = bytearray(2 * 1024 ** 3)")
    assert r.isolation == "rlimits" and r.status == "memory"
    assert any("bubblewrap" in w for w in r.warnings)
    assert fb.run_python("print(6 * 7)").stdout == "42\n"


def test_pool_runs_in_parallel_and_keeps_order(sb):
    with SandboxPool(2) as pool:
        results = list(pool.map(lambda i: sb.run_python(f"print({i})").stdout, range(6)))
    assert results == [f"{i}\n" for i in range(6)]


def test_missing_bwrap_is_said_loudly(monkeypatch):
    import sleuth.sandbox.runner as runner

    real = runner.shutil.which
    monkeypatch.setattr(runner.shutil, "which", lambda name: None if name == "bwrap" else real(name))
    with pytest.warns(RuntimeWarning, match="bubblewrap"):
        fb = Sandbox()
    assert fb.isolation == "rlimits"
    with pytest.raises(FileNotFoundError, match="bwrap"):
        Sandbox(isolation="bwrap")


def test_process_cap_is_enforced(sb):
    code = ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
            "    n += 1\nprint(n)")
    r = sb.run_python(code)
    assert r.stdout.strip().isdigit() and 0 < int(r.stdout) < 16  # Limits(processes=16) above


def test_two_processes_sandboxing_at_once_do_not_kill_each_other(tmp_path):
    """Each run's clean-up kills every process of its uid: uids must differ across processes too."""
    script = ("import sys\nfrom sleuth.sandbox import Limits, Sandbox\n"
              "r = Sandbox(Limits(wall_s=20, cpu_s=5)).run_python('import time; time.sleep(3); print(\"done\")')\n"
              "print(r.status, r.stdout.strip())\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["ok done", "ok done"]


def test_mounts_are_read_only_and_collected_files_come_back(sb, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("secret-free")
    code = ("import os\nprint(open('m/x.txt').read())\n"
            "try:\n    open('m/x.txt', 'w').write('changed')\nexcept OSError as e:\n    print('refused', e.errno)\n"
            "open('out.txt', 'w').write(os.environ['WHERE'])\n")
    r = sb.run([sb.python, "-I", "-S", "main.py"], {"main.py": code}, mounts={"m": tmp_path / "data"},
               collect=("out.txt", "missing.txt"), env={"WHERE": "{work}/out.txt"})
    assert r.ok, r.stderr
    assert r.stdout.splitlines()[0] == "secret-free"
    assert (tmp_path / "data" / "x.txt").read_text() == "secret-free"
    if sb.bwrap:
        assert r.stdout.splitlines()[1].startswith("refused") and r.files == {"out.txt": b"/work/out.txt"}
    with pytest.raises(ValueError, match="outside"):
        sb.run(["true"], mounts={"../up": tmp_path})
