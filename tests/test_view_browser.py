"""`sleuth view` in a real browser: Debian's headless Chromium, driven through Debian's chromedriver by selenium.
Real runs (two evals, a GRPO step, a run with HTML and bad bytes in it) served by the real CLI; each page loads
with no console error, shows the episode's text, and its screenshot is not blank; the static export opens from
disk with no server."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sleuth.cli.main import main
from sleuth.core.net import free_port

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="Debian's chromium and chromium-driver "
                                "are not installed (`make test` installs them)")
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("view_runs")
    common = ["--tasks", "hotpotqa:dev", "--limit", "6", "--harness", "json"]
    assert main(["eval", "--policy", "oracle", "--out", str(root / "oracle"), *common]) == 0
    assert main(["eval", "--policy", "first-k", "--out", str(root / "first-k"), *common]) == 0
    from sleuth.training.config import load_config
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config(overrides={"model": tiny_model_dir, "out": str(root / "grpo"), "env_args": {"harness": "text"},
                                 "task_limit": 8, "rollout.max_tokens": 8, "rollout.tasks_per_step": 2,
                                 "rollout.group_size": 2, "rollout.temperature": 0.7, "checkpoint.export_hf": False,
                                 "tensorboard": False, "deepspeed.lr": 1e-3, "max_steps": 2})
    Trainer(cfg, progress=False).train()
    evil = root / "evil"
    shutil.copytree(root / "oracle", evil)
    lines = (evil / "trajectories.jsonl").read_text().splitlines()
    first = json.loads(lines[0])  # the model "wrote" HTML: its tokens, its text and its call's error carry it
    from sleuth.agents.policies.load import load_tokenizer

    ids = load_tokenizer("smollm2").encode(EVIL, add_special_tokens=False)
    turn = first["turns"][0]
    turn.update(action_ids=ids + turn["action_ids"], action_logprobs=[-0.5] * len(ids) + turn["action_logprobs"],
                action_text=EVIL + turn["action_text"], error=EVIL)
    raw = [json.dumps(first).encode()] + [x.encode() for x in lines[1:]]
    raw[1] = raw[1].replace(b'"task_id": "', b'"task_id": "\xff\xfe', 1)  # bytes that are not UTF-8
    (evil / "trajectories.jsonl").write_bytes(b"\n".join(raw) + b"\n" + lines[2][:40].encode())  # torn last line
    return {"oracle": root / "oracle", "first-k": root / "first-k", "grpo": root / "grpo", "evil": evil}


@pytest.fixture(scope="module")
def served(runs):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sleuth.cli", "view", *map(str, runs.values()), "--port", str(port),
                             "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/runs", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _open(browser, url: str, text: str, timeout_s: float = 20.0) -> str:
    """Load `url`, wait until the page shows `text`; the page's text. Fails on any console error."""
    browser.get(url)
    end = time.monotonic() + timeout_s
    body = ""
    while time.monotonic() < end:
        body = browser.execute_script("return document.body ? document.body.innerText : ''")
        if text in body:
            break
        time.sleep(0.2)
    assert text in body, body[:2000]
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    return body


def _not_blank(browser, path: Path) -> None:
    """The screenshot holds more than a few colours (a blank or error-only page would not)."""
    from PIL import Image  # matplotlib's dependency

    browser.save_screenshot(str(path))
    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert image.width >= 1000 and len(colours) > 20, (image.size, len(colours))


def _ids(served: str) -> dict[str, str]:
    return {Path(r["path"]).name: r["id"] for r in httpx.get(f"{served}/api/runs").json()["runs"]}


def test_the_episode_list_sorts_searches_and_keeps_its_view_in_the_url(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    run = _ids(served)["oracle"]
    _open(browser, f"{served}/#/run/{run}/episodes?sort=-score", "final")
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 6
    _not_blank(browser, tmp_path / "list.png")
    first_task = httpx.get(f"{served}/api/run/{run}/episodes?limit=1").json()["rows"][0]["task_id"]
    body = _open(browser, f"{served}/#/run/{run}/episodes?q={first_task}", first_task)
    assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) == 1, body[:500]
    browser.refresh()  # the URL holds the view
    _open(browser, browser.current_url, first_task)
    assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) == 1


def test_an_episode_shows_its_text_with_tokens_coloured_and_values_on_hover(served, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    oracle = _ids(served)["oracle"]
    episode = httpx.get(f"{served}/api/run/{oracle}/episode/0").json()
    answer = episode["turns"][-1]["tool_call"]["arguments"]["text"]
    _open(browser, f"{served}/#/run/{oracle}/episode/0", answer)  # the conversation, its calls and verdict
    assert len(browser.find_elements(By.CSS_SELECTOR, ".toks.action span.t")) == sum(
        len(t["action"]) for t in episode["turns"])
    _not_blank(browser, tmp_path / "episode.png")
    run = _ids(served)["grpo"]  # sampled tokens: their logprobs differ, so do their colours
    i = httpx.get(f"{served}/api/run/{run}/episodes?limit=1").json()["rows"][0]["i"]
    episode = httpx.get(f"{served}/api/run/{run}/episode/{i}").json()
    tokens = [t for turn in episode["turns"] for t in turn["action"]]
    _open(browser, f"{served}/#/run/{run}/episode/{i}?color=logprob", "colour action tokens by")
    spans = browser.find_elements(By.CSS_SELECTOR, ".toks.action span.t")
    assert len(spans) == len(tokens)
    for span, token in list(zip(spans, tokens, strict=True))[:4]:
        title = span.get_attribute("title")
        assert f"id {token['id']}" in title and "logprob" in title and "adv" in title, title
    assert all(s.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)" for s in spans)  # coloured
    ActionChains(browser).move_to_element(spans[0]).perform()
    assert f"id {tokens[0]['id']}" in browser.find_element(By.ID, "tokentip").text


def test_a_training_group_shows_its_members_and_their_advantages(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    run = _ids(served)["grpo"]
    rows = httpx.get(f"{served}/api/run/{run}/episodes?limit=all").json()["rows"]
    row = next(r for r in rows if r["step"] == 1)
    group = httpx.get(f"{served}/api/run/{run}/group/{row['group']}?step=1").json()
    assert len(group["members"]) == 2 and all(m["advantage"] is not None for m in group["members"])
    episode = httpx.get(f"{served}/api/run/{run}/episode/{row['i']}").json()
    assert "adv" in episode["quantities"] and all(t["adv"] is not None for turn in episode["turns"]
                                                   for t in turn["action"])
    from urllib.parse import quote

    _open(browser, f"{served}/#/run/{run}/group/{quote(row['group'], safe='')}?step=1", row["task_id"])
    assert len(browser.find_elements(By.CSS_SELECTOR, ".member")) == 2
    _not_blank(browser, tmp_path / "group.png")
    _open(browser, f"{served}/#/run/{run}/episode/{row['i']}?color=adv", "advantage" if False else "adv")
    _open(browser, f"{served}/#/run/{run}", "reward")  # the run page with its training curves
    assert browser.find_elements(By.CSS_SELECTOR, ".chart svg")


def test_compare_pairs_two_evals_by_task_with_filters(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    ids = _ids(served)
    data = httpx.get(f"{served}/api/compare?a={ids['first-k']}&b={ids['oracle']}").json()
    assert data["counts"]["better"] >= 1 and len(data["rows"]) == 6
    _open(browser, f"{served}/#/compare/{ids['first-k']}/{ids['oracle']}?filter=better", data["rows"][0]["task_id"])
    shown = browser.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")
    assert len(shown) == data["counts"]["better"]
    _not_blank(browser, tmp_path / "compare.png")


def test_html_and_bad_bytes_in_a_trajectory_are_shown_as_text_never_run(served, browser):
    run = _ids(served)["evil"]
    body = _open(browser, f"{served}/#/run/{run}/episode/0", "<script>window.__pwned = 1</script>")
    assert browser.execute_script("return window.__pwned === undefined")
    assert "onerror" in body
    listing = httpx.get(f"{served}/api/run/{run}/episodes?limit=all").json()
    assert listing["total"] == 6 and "\ufffd" in listing["rows"][1]["task_id"]  # the torn last line waits


def test_the_static_export_opens_from_disk_with_no_server(runs, browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = tmp_path / "view.html"
    assert main(["view", str(runs["oracle"]), str(runs["grpo"]), "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "SLEUTH_DATA" in text and "http://" not in text.split("SLEUTH_DATA", 1)[0].lower().replace(
        "http://www.w3.org", "")  # nothing fetched from the network before the data
    _open(browser, f"{out.as_uri()}#/run/0/episodes", "final")
    assert len(browser.find_elements(By.CSS_SELECTOR, "tbody tr")) == 6
    _open(browser, f"{out.as_uri()}#/run/0/episode/0", "answer")
    assert browser.find_elements(By.CSS_SELECTOR, ".toks.action span.t")
    _not_blank(browser, tmp_path / "export.png")


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: p, "is not a run directory"),
    (lambda p: p / "missing", "no such directory"),
])
def test_a_path_that_is_no_run_is_one_line_and_exit_2(tmp_path, capsys, make_bad, message):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["view", str(make_bad(tmp_path)), "--no-open"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
