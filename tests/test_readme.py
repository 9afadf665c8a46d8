"""The README's custom-env snippet is part of the API contract: run it exactly as written."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_custom_env_snippet_runs():
    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- custom-env[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m, "README lost its custom-env snippet"
    code = m.group(1)
    assert len(code.strip().splitlines()) < 50
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    env = scope["env"]
    assert scope["reward"] == 1.0 and scope["obs"] == "42"
    # the env it defines is a real registered gymnasium env with malformed-input handling
    env.reset(options={"task": scope["Task"](id="t2", question="1 + 1?", answer="2")})
    obs, *_ = env.step('<tool_call>{"name": "calc", "arguments": {"a": 1, "op": "^", "b": 1}}</tool_call>')
    assert "unknown operator '^'" in obs
