import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    """Every nav entry exists and every internal link resolves (mkdocs --strict)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    # No -q: mkdocs counts only the warnings it logs, so a quiet strict build passes with broken links.
    out = subprocess.run([mkdocs, "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "WARNING" not in out.stderr, out.stderr
    assert (tmp_path / "site" / "envs" / "search" / "index.html").exists()
