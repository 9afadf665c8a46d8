"""SWE end to end on a real package (toolz's sdist from the pip index, its own test suite in the sandbox):
task synthesis (deterministic, resumable), the verifier (gold, empty, broken, test-editing, hostile
patches), the env's tools, the scripted gold agent (solves every task) and do-nothing agent (none), batch
scoring, and the SWE-bench Lite loader with its Docker backend's refusal."""

import json
import shutil
import subprocess
import sys

import pytest

import sleuth
from sleuth.envs.outcome import reset_info, step_info
from sleuth.synth.swe import SWEBuilder, parse_package
from sleuth.tasks import load_tasks
from sleuth.tasks.swe import load_swe, shipped_sets
from sleuth.verifiers.base import CannotScore
from sleuth.verifiers.swe import SWEVerifier, swe_test_ids

PACKAGE = "toolz==1.2.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("swe") / "toolz.jsonl"
    summary = SWEBuilder(PACKAGE, out, n=3, seed=7, progress=False).build()
    return out, summary, [json.loads(x) for x in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def verifier():
    return SWEVerifier(wall_s=120)


@pytest.fixture(scope="module")
def shipped():
    return {t.id: t for t in load_swe("toolz-1.2.0")}


def test_build_writes_swe_bench_records(built):
    _, summary, recs = built
    assert summary["tasks"] == 3 and len(recs) == 3
    for r in recs:
        for key in ("instance_id", "repo", "version", "base_commit", "patch", "test_patch", "problem_statement",
                    "hints_text", "created_at", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit"):
            assert key in r
        f2p, p2p = swe_test_ids(r["FAIL_TO_PASS"]), swe_test_ids(r["PASS_TO_PASS"])
        assert f2p and p2p and not set(f2p) & set(p2p)
        assert r["patch"].startswith("diff --git a/toolz/") and r["bug_patch"].startswith("diff --git a/toolz/")
        changed = [ln[1:].strip() for ln in r["patch"].splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln[1:].strip()) >= 8]
        assert not any(c in r["problem_statement"] for c in changed), "the statement must not show the fix"
        assert f2p[0] in r["problem_statement"] and r["sdist"]["sha256"]


def test_build_is_reproducible_and_resumes(built, tmp_path):
    _, _, recs = built
    out = tmp_path / "again.jsonl"

    class Stop(Exception):
        pass

    def stop(_):
        raise Stop

    with pytest.raises(Stop):  # interrupted after its first task
        SWEBuilder(PACKAGE, out, n=3, seed=7, progress=False).build(on_task=stop)
    assert len(out.read_text().splitlines()) == 1
    with open(out, "a") as f:
        f.write('{"instance_id": "cut off mid-li')  # what a kill during a write leaves
    summary = SWEBuilder(PACKAGE, out, n=3, seed=7, progress=False).build()
    again = [json.loads(x) for x in out.read_text().splitlines()]
    assert summary["tasks"] == 3
    assert [r["instance_id"] for r in again] == [r["instance_id"] for r in recs]
    assert [r["patch"] for r in again] == [r["patch"] for r in recs]


def test_package_spec_errors_are_clear():
    assert parse_package("toolz==1.2.0") == ("toolz", "1.2.0")
    for bad in ("toolz", "==1.0", "toolz=="):
        with pytest.raises(ValueError, match="NAME==VERSION"):
            parse_package(bad)


def test_verifier_scores_gold_empty_broken_and_wrong_patches(built, verifier):
    _, _, recs = built
    rec = recs[0]
    gold = verifier(rec, rec["patch"])
    assert gold.score == 1.0 and gold.details["resolved"]
    assert all(t["outcome"] == "passed" for t in gold.details["tests"])
    assert len(gold.details["tests"]) == len(swe_test_ids(rec["FAIL_TO_PASS"])) + len(swe_test_ids(rec["PASS_TO_PASS"]))
    assert verifier(rec, "").details["error"] == "empty_patch"
    broken = verifier(rec, "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert (broken.score == 0.0 and broken.details["error"] == "patch_failed"
            and "does not apply" in broken.details["message"])
    again = verifier(rec, rec["bug_patch"])  # the bug once more: does not apply (and is never run in reverse)
    assert again.score == 0.0 and again.details["error"] == "patch_failed"
    target = rec["mutation"]["file"]
    comment = rec["bug_patch"].split("@@")[0] + "@@ -1 +1,2 @@\n+# a harmless comment\n" + \
        _first_line(built, rec, target)
    wrong = verifier(rec, comment)  # applies, fixes nothing
    assert wrong.score == 0.0 and wrong.details["applied_with"] and wrong.details["fail_to_pass_passed"] == 0


def _first_line(built, rec, target):
    from sleuth.sandbox.repos import RepoCache, RepoSpec

    clean = RepoCache().source(RepoSpec.from_dict(rec["sdist"]))
    return " " + (clean / target).read_text().splitlines(keepends=True)[0]


def test_verifier_puts_edited_tests_back(built, verifier):
    """A patch that 'fixes' the failure by deleting the failing test's body does not pass."""
    from sleuth.sandbox.repos import RepoCache, RepoSpec
    from sleuth.sandbox.workspace import unified_diff

    _, _, recs = built
    rec = recs[0]
    test_file = swe_test_ids(rec["FAIL_TO_PASS"])[0].split("::")[0]
    clean = RepoCache().source(RepoSpec.from_dict(rec["sdist"]))
    old = (clean / test_file).read_text()
    cheat = unified_diff(test_file, old, "")
    v = verifier(rec, cheat)
    assert v.score == 0.0 and v.details["restored_test_files"] == [test_file]
    assert v.details["fail_to_pass_passed"] == 0


def test_a_package_the_index_cannot_serve_is_cannot_score(built, tmp_path):
    from sleuth.sandbox.repos import RepoCache

    _, _, recs = built
    rec = {**recs[0], "sdist": {**recs[0]["sdist"], "version": "0.0.0.dev999"}}
    with pytest.raises(CannotScore, match="pip could not fetch"):
        SWEVerifier(cache=RepoCache(tmp_path / "cache"))(rec, rec["patch"])
    tampered = {**recs[0], "sdist": {**recs[0]["sdist"], "sha256": "0" * 64}}
    with pytest.raises(CannotScore, match="different file"):
        SWEVerifier(cache=RepoCache(tmp_path / "cache2"))(tampered, tampered["patch"])


@pytest.mark.skipif(not shutil.which("bwrap"),
                    reason="without bubblewrap nothing is read-only: never run this unisolated")
def test_hostile_patches_are_contained(built):
    """Patched library code that writes into the repository, or never returns: a verdict, not damage."""
    from sleuth.sandbox.repos import RepoCache, RepoSpec
    from sleuth.sandbox.workspace import remove_workspace, unified_diff
    from sleuth.verifiers.swe import buggy_workspace

    _, _, recs = built
    rec = recs[0]
    target = rec["mutation"]["file"]
    clean = RepoCache().source(RepoSpec.from_dict(rec["sdist"]))
    fixed = (clean / target).read_text()
    ws = buggy_workspace(clean, rec)
    buggy = (ws / target).read_text()
    remove_workspace(ws)

    def fix_plus(code: str) -> str:  # the gold fix, plus code run when the module is imported
        return unified_diff(target, buggy, fixed + code)

    writer = SWEVerifier(wall_s=60)(rec, fix_plus(
        "\nopen(__file__, 'w').write('')\nimport os\nos.system('rm -rf /work/repo /work/env 2>/dev/null')\n"))
    assert writer.score == 0.0  # the import fails: the repository is read-only in the sandbox
    assert (clean / target).read_text() == fixed
    looping = SWEVerifier(wall_s=8)(rec, fix_plus("\nwhile True:\n    pass\n"))
    assert looping.score == 0.0 and looping.details["run_status"] == "timeout"


def test_env_tools_and_their_errors(shipped):
    task = next(iter(shipped.values()))
    env = sleuth.make("sleuth/SWE-v0", budget=30)
    try:
        _, info = env.reset(options={"task": task})
        assert [t["function"]["name"] for t in reset_info(info).tools] == ["list_dir", "read_file", "search", "edit",
                                                                  "run_tests", "submit"]
        call = env.unwrapped.tools
        assert "toolz/" in call["list_dir"].fn(".")
        for bad in ("../", "/etc", "toolz/../../x"):
            with pytest.raises(Exception, match="outside|absolute"):
                call["list_dir"].fn(bad)
        text = call["read_file"].fn("toolz/itertoolz.py", 1, 3)
        assert text.startswith("toolz/itertoolz.py lines 1-3 of") and "    1  " in text
        with pytest.raises(Exception, match="past the end"):
            call["read_file"].fn("toolz/itertoolz.py", 10**6)
        assert "toolz/itertoolz.py:" in call["search"].fn("def partition_all")
        with pytest.raises(Exception, match="bad pattern"):
            call["search"].fn("(unclosed")
        with pytest.raises(Exception, match="occurs .* times"):
            call["edit"].fn("toolz/itertoolz.py", "def ", "def  ")
        with pytest.raises(Exception, match="not found"):
            call["edit"].fn("toolz/itertoolz.py", "no such text anywhere", "x")
        with pytest.raises(Exception, match="not a test selector"):
            call["run_tests"].fn("--collect-only -p evil")
        out = call["run_tests"].fn("")  # default: the failing tests of the statement
        assert "failed" in out.splitlines()[0]
        obs, reward, term, trunc, info = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
        assert term and reward == 0.0 and step_info(info).verdict.details["error"] == "empty_patch"
    finally:
        env.close()


def test_running_out_of_turns_scores_the_workspace(shipped):
    from sleuth.envs.swe import swe_gold_plan

    task = next(iter(shipped.values()))
    plan = [c for c in swe_gold_plan(task.answer) if c.name == "edit"]
    env = sleuth.make("sleuth/SWE-v0", budget=len(plan) - 1)  # one last turn after the budget: the final edit
    env.reset(options={"task": task})
    for call in plan:
        _, reward, term, trunc, info = env.step(json.dumps({"name": call.name, "arguments": call.arguments}))
    assert trunc and not term and reward == 1.0 and step_info(info).verdict.details["resolved"]
    env.close()


def test_gold_agent_solves_and_noop_solves_none(tmp_path, shipped):
    """The scripted gold agent replays each patch through read_file/edit/run_tests/submit (a sample of the
    shipped set here; `bench/swe.py --all` runs every task)."""
    sample = list(shipped.values())[:2] + load_swe("boltons-26.2.0")[:2]
    path = tmp_path / "tasks.jsonl"
    from sleuth.tasks.base import write_tasks

    write_tasks(sample, path)
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "sleuth.cli", "eval", "--env", "sleuth/SWE-v0", "--tasks", str(path),
           "--policy", "oracle,noop", "--out", str(out), "--env-threads", "2"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    oracle = json.loads((out / "oracle-json" / "summary.json").read_text())
    noop = json.loads((out / "noop-json" / "summary.json").read_text())
    assert oracle["n"] == noop["n"] == 4
    assert oracle["score"] == 1.0 and noop["score"] == 0.0
    by_package = oracle["breakdown"]["package"]
    assert by_package == {p: {"n": 2, "score": 1.0, "resolved": 1.0} for p in ("boltons", "toolz")}


def test_batch_scoring_cli(built, tmp_path):
    _, _, recs = built
    lines = [{**recs[0], "response": recs[0]["patch"]}, {**recs[1], "response": ""},
             {**recs[2], "response": "not a diff"}, {"instance_id": "x", "response": "y"}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    r = subprocess.run([sys.executable, "-m", "sleuth.cli", "score", "--verifier", "swe", "--input", str(inp),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    scored = [json.loads(x) for x in out.read_text().splitlines()]
    assert [s.get("score") for s in scored] == [1.0, 0.0, 0.0, None]
    assert "not a SWE task record" in scored[3]["error"]


def test_trainer_adapters_score_swe_records(built):
    from sleuth.verifiers.adapters.openrlhf import openrlhf_rewards
    from sleuth.verifiers.adapters.verl import compute_score

    _, _, recs = built
    rec = recs[1]
    reply = f"The bug is fixed by this patch:\n```diff\n{rec['patch']}```"
    assert compute_score("swe/toolz", reply, json.dumps(rec))["score"] == 1.0
    assert compute_score("swe/toolz", "I could not fix it.", rec)["score"] == 0.0
    out = openrlhf_rewards("swe", ["PROMPT" + reply + "<|im_end|>"], ["PROMPT"], [json.dumps(rec)])
    assert out["rewards"] == [1.0]


def test_swebench_lite_loads_and_its_backend_says_what_is_missing():
    tasks = load_tasks("swebench_lite:test")
    assert len(tasks) == 300 and tasks[0].id == "django__django-15202"
    assert tasks[0].question and tasks[0].answer.startswith("diff --git")
    assert swe_test_ids(tasks[0].payload["FAIL_TO_PASS"])
    with pytest.raises(CannotScore, match="Docker") as e:
        SWEVerifier()(tasks[0], tasks[0].answer)
    assert "swebench/sweb.eval.x86_64.django_1776_django-15202:latest" in str(e.value)
    env = sleuth.make("sleuth/SWE-v0")
    with pytest.raises(ValueError, match="official SWE-bench instance"):
        env.reset(options={"task": tasks[0]})


def test_shipped_sets_are_listed_and_loadable():
    assert "toolz-1.2.0" in shipped_sets()
    tasks = load_tasks("swe:all")
    assert len(tasks) >= 30 * len(shipped_sets())
    assert {t.payload["package"] for t in tasks} >= {"toolz"}
    with pytest.raises(FileNotFoundError, match="shipped"):
        load_swe("nope-0.0")


def test_the_stock_trainer_trains_on_swe(tiny_model_dir, tmp_path):
    """SWE-v0 plugs into `sleuth train` like any env: rollouts in workspaces, verifier rewards, an update."""
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config(overrides={
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "env": "SWE-v0", "tasks": "swe:toolz-1.2.0",
        "env_args": {"budget": 1}, "task_limit": 4, "max_steps": 1, "rollout.max_tokens": 8,
        "rollout.tasks_per_step": 2, "rollout.group_size": 2, "rollout.temperature": 0.7,
        "checkpoint.export_hf": False, "deepspeed.lr": 1e-3, "loss.entropy_coef": 0.01})
    rows = Trainer(cfg, progress=False).train()
    assert [r["policy_version"] for r in rows] == [1] and rows[0]["grad_norm"] > 0
    trajs = [json.loads(x)
             for x in (tmp_path / "run" / "rollouts" / "step-000001.rank0.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 and all(t["env_id"].endswith("SWE-v0") for t in trajs)
    assert all(t["verdict"]["details"]["instance_id"] == t["task_id"] for t in trajs)


def test_build_swe_cli(tmp_path):
    out = tmp_path / "t.jsonl"
    cli = [sys.executable, "-m", "sleuth.cli", "tasks", "build-swe"]
    ok = subprocess.run([*cli, "--package", PACKAGE, "--n", "1", "--out", str(out)], capture_output=True, text=True,
                        timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["tasks"] == 1 and len(out.read_text().splitlines()) == 1
    bad = subprocess.run([*cli, "--package", "toolz", "--out", str(tmp_path / "x.jsonl")], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "NAME==VERSION" in bad.stderr
    missing = subprocess.run([*cli, "--package", "toolz==0.0.0.dev999", "--out", str(tmp_path / "y.jsonl")],
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "pip could not fetch" in missing.stderr


def test_swe_env_passes_gymnasiums_full_env_checker(shipped):
    """Its repository is `env.repo`: gymnasium's `Env.spec` stays the registration the checker reads."""
    import warnings

    from gymnasium.utils.env_checker import check_env

    env = sleuth.make("sleuth/SWE-v0", tasks=list(shipped.values())[:2])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any checker warning fails the test
            check_env(env.unwrapped, skip_render_check=True)
        assert env.unwrapped.spec.id == "sleuth/SWE-v0" and env.unwrapped.repo.name == "toolz"
    finally:
        env.close()
