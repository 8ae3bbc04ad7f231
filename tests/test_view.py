"""`redline view` over the runs `redline quickstart` writes: the HTTP app (keys, files, S3, broken
runs) and the pages in a real headless Chromium (run list, run page, filters, compare, live state)."""

from __future__ import annotations

import csv
import io
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pyarrow.dataset as ds
import pytest

from conftest import VENV_BIN, free_port, wait_for_port


@pytest.fixture(scope="module")
def runs_root(quickstart_dir, ray_session, wordnet_ready) -> Path:
    """The quickstart chain's runs (reused when the CLI test made them), a second transfer run of
    two victims to compare with, and a damaged run directory."""
    from redline.cli import main
    from redline.pipelines.quickstart import quickstart_transfer_config
    from redline.pipelines.transfer import run_transfer

    assert main(["quickstart", "--output", str(quickstart_dir)]) == 0
    config = quickstart_transfer_config(str(quickstart_dir), str(quickstart_dir / "quickstart-taebench"),
                                        quickstart_dir / "models" / "unused")
    config = config.model_copy(update={"run_name": "transfer-two-victims",
                                       "victims": [v for v in config.victims if v.kind != "hf"]})
    run_transfer(config)
    from redline.cluster.config import validate_config
    from redline.pipelines.quickstart import QUICKSTART_KEYWORDS, sample_path
    from redline.pipelines.score import ScoreConfig, run_score

    run_score(validate_config(ScoreConfig, {  # a score run of two detectors: confusion matrices, per-text view
        "corpus": {"path": str(sample_path("toxic_sample_test.csv")), "text_column": "text", "label_column": "label",
                   "toxic_values": ["toxic"], "dataset": "redline-sample"},
        "detectors": [{"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.5},
                      {"name": "keywords", "kind": "keywords", "patterns": QUICKSTART_KEYWORDS, "num_cpus": 0.25}],
        "output": str(quickstart_dir), "run_name": "score-two-detectors", "shard_size": 20}))
    broken = quickstart_dir / "half-written-run"
    broken.mkdir(exist_ok=True)
    (broken / "manifest.json").write_text('{"pipeline": "attack", "state": "runn')
    return quickstart_dir


@pytest.fixture
def client(runs_root):
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    with TestClient(build_app(str(runs_root)), base_url="http://127.0.0.1:8765") as c:
        yield c


def test_run_list_shows_every_run_with_its_state_and_headline_figures(client, runs_root):
    listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    expected = {p.name for p in runs_root.iterdir() if (p / "manifest.json").is_file()}
    assert set(listed) == expected
    assert listed["half-written-run"]["state"] == "unreadable"
    assert "not valid JSON" in listed["half-written-run"]["error"]
    transfer = json.loads((runs_root / "quickstart-transfer" / "manifest.json").read_text())
    figures = {(f["label"], f["heading"]): f["value"] for f in listed["quickstart-transfer"]["figures"]}
    assert any(row["tae_rate"] is not None for row in transfer["summary"])
    for row in transfer["summary"]:  # a victim without a transfer rate (the attack's own) shows none
        assert figures.get((f"{row['victim']} {row['dataset']}", "ASR TAE")) == row["tae_rate"]
    assert listed["quickstart-attack"]["state"] == "complete" and listed["quickstart-attack"]["wall_s"] > 0
    page = client.get("/")
    assert page.status_code == 200 and "half-written-run" in page.text and "not valid JSON" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")


def test_rows_filter_sort_and_page_straight_from_parquet(client, runs_root):
    attempts = ds.dataset(runs_root / "quickstart-attack" / "attempts").to_table().to_pylist()
    want = [r for r in attempts if r["recipe"] == "pwws" and r["status"] == "success"]
    page = client.get("/run", params={"id": "quickstart-attack", "table": "attempts", "f_recipe": "pwws",
                                      "f_status": "success", "sort": "-queries", "n": 500})
    assert page.status_code == 200
    assert f"{len(want)} of {len(attempts)} rows" in page.text
    from redline.view.rows import open_table, query, tables

    ref = next(t for t in tables(str(runs_root), "quickstart-attack") if t.name == "attempts")
    result = query(open_table(ref), {"recipe": "pwws", "status": "success"}, "-queries", 1, 10)
    assert result.total == len(want) and result.pages == -(-len(want) // 10)
    queries = [r["queries"] for r in result.rows]
    assert queries == sorted(queries, reverse=True) and queries[0] == max(r["queries"] for r in want)
    assert "<mark>" in page.text and "<del>" in page.text  # seed beside the perturbed text, changes marked
    assert ">more_examples<" not in page.text.split("<thead>")[1].split("</thead>")[0]  # not a first column
    listed = client.get("/run", params=[("id", "quickstart-attack"), ("table", "attempts"), ("cols", "1"),
                                        ("col", "id"), ("col", "more_examples")]).text
    assert 'title="a list of values: not sortable">more_examples<' in listed  # a list column: no sort link
    bad = client.get("/run", params={"id": "quickstart-attack", "f_nosuchcolumn": "x"})
    assert bad.status_code == 200 and "no column &#39;nosuchcolumn&#39; to filter on" in bad.text


def test_the_rows_a_page_selects_export_as_csv_and_json_lines(client, runs_root):
    attempts = ds.dataset(runs_root / "quickstart-attack" / "attempts").to_table().to_pylist()
    want = [r["id"] for r in attempts if r["recipe"] == "pwws" and r["status"] == "success"]
    page = client.get("/run", params={"id": "quickstart-attack", "table": "attempts", "f_recipe": "pwws",
                                      "f_status": "success"})
    link = "/export?id=quickstart-attack&amp;table=attempts&amp;f_recipe=pwws&amp;f_status=success&amp;format=csv"
    assert link in page.text and link.replace("csv", "jsonl") in page.text
    got = client.get(link.replace("&amp;", "&"))
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/csv")
    assert got.headers["content-disposition"] == 'attachment; filename="quickstart-attack-attempts.csv"'
    assert [r["id"] for r in csv.DictReader(io.StringIO(got.text))] == want
    lines = client.get(link.replace("&amp;", "&").replace("csv", "jsonl")).text.splitlines()
    assert [json.loads(line)["id"] for line in lines] == want
    assert client.get("/export", params={"id": "quickstart-attack", "table": "attempts", "format": "xlsx"}).status_code == 400
    assert client.get("/export", params={"id": "quickstart-attack", "table": "nope"}).status_code == 404
    assert client.get("/export", params={"id": "../etc", "table": "attempts"}).status_code in (400, 404)


def test_list_columns_filter_by_membership():
    import pyarrow as pa

    from redline.view.rows import facets, query

    table = pa.table({"list": ["normal", "mal", "mal"], "hits": [["o-greedy-hit"], None, ["o-sample-avg-1-hit",
                                                                                        "o-sample-avg-2-hit"]]})
    assert facets(table)["hits"] == ["o-greedy-hit", "o-sample-avg-1-hit", "o-sample-avg-2-hit"]
    assert [r["list"] for r in query(table, {"hits": "o-sample-avg-2-hit"}, None, 1, 10).rows] == ["mal"]
    assert query(table, {"list": "mal", "hits": "o-greedy-hit"}, None, 1, 10).total == 0
    # a list column cannot be sorted: the page offers no sort (and no arrow) for it
    page = query(table, {}, "-hits", 1, 10)
    assert page.sortable == {"list"} and [r["list"] for r in page.rows] == ["normal", "mal", "mal"]


def test_attempts_are_shown_by_outcome(client):
    from redline.view.diff import outcome_view

    pair = ("seed_text", "perturbed_text")
    seed = {"seed_text": "you idiot <b>"}
    assert outcome_view({**seed, "perturbed_text": "you idiiot <b>", "status": "success"}, pair)[2] == ""
    skipped = outcome_view({**seed, "perturbed_text": None, "status": "skipped", "reason": "already benign"}, pair)
    assert skipped == ("you idiot &lt;b&gt;", "", "skipped: already benign")  # the seed alone, not a deletion
    before, after, note = outcome_view({**seed, "perturbed_text": "you idjot <b>", "status": "failed",
                                        "reason": "query budget spent"}, pair)
    assert "<mark>idjot</mark>" in after and note.startswith("failed: the best candidate found") and "budget" in note
    # on the run page (the quickstart attack has both): a skipped attempt says why and deletes nothing; a
    # failed one is labelled
    for status, shown in (("skipped", "skipped: "), ("failed", "failed: the best candidate found")):
        page = client.get("/run", params={"id": "quickstart-attack", "table": "attempts", "f_status": status,
                                          "n": 500})
        body = page.text.split("<tbody>", 1)[1]
        assert shown in body
        if status == "skipped":
            assert "<del>" not in body


def test_word_diff_marks_only_changed_words():
    from redline.view.diff import word_diff

    before, after = word_diff("you are a worthless idiot <b>", "you are a worthless idifot <b>")
    assert before == "you are a worthless <del>idiot</del> &lt;b&gt;"
    assert after == "you are a worthless <mark>idifot</mark> &lt;b&gt;"


def test_files_stay_inside_the_run_and_reports_open_sandboxed(client):
    ok = client.get("/file", params={"id": "quickstart-attack", "name": "plots/asr.png"})
    assert ok.status_code == 200 and ok.content[:4] == b"\x89PNG"
    html = client.get("/file", params={"id": "quickstart-attack", "name": "report.html"})
    assert html.status_code == 200 and "sandbox" in html.headers["content-security-policy"]
    for params in ({"id": "quickstart-attack", "name": "../quickstart-transfer/report.html"},
                   {"id": "../quickstart-attack", "name": "report.html"}, {"id": "/etc", "name": "passwd.txt"},
                   {"id": "quickstart-attack", "name": "attempts/part-00000.parquet"}):
        assert client.get("/file", params=params).status_code == 400, params
    assert client.get("/run", params={"id": "../../etc"}).status_code == 400
    assert client.get("/run", params={"id": "no-such-run"}).status_code == 404


def test_a_key_guards_every_page_but_health(runs_root):
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    with TestClient(build_app(str(runs_root), key="s3cret"), base_url="http://127.0.0.1:8765") as c:
        assert c.get("/healthz").status_code == 200
        denied = c.get("/api/runs")
        assert denied.status_code == 401 and "needs its key" in denied.text
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        opened = c.get("/run", params={"id": "quickstart-attack", "key": "s3cret"}, follow_redirects=False)
        assert opened.status_code == 303 and "key=" not in opened.headers["location"]
        assert "httponly" in opened.headers["set-cookie"].lower()
        assert c.get(opened.headers["location"]).status_code == 200  # the cookie carries it from now on


def test_cli_refuses_exposure_without_a_key_and_a_missing_location(capsys, runs_root, monkeypatch):
    from redline.cli import main

    monkeypatch.delenv("REDLINE_API_KEY", raising=False)
    assert main(["view", str(runs_root), "--host", "0.0.0.0"]) == 2
    assert "exposes the runs to the network without an API key" in capsys.readouterr().err
    assert main(["view", str(runs_root / "nothing-here")]) == 2
    assert "no directory" in capsys.readouterr().err


def test_runs_on_s3_and_a_broken_one_beside_them(s3_env, runs_root):
    import boto3
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    s3 = boto3.client("s3", endpoint_url=s3_env)
    s3.create_bucket(Bucket="redline-view")
    for run in ("quickstart-transfer", "transfer-two-victims"):
        for path in (runs_root / run).rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "redline-view", f"team/{run}/{path.relative_to(runs_root / run)}")
    s3.put_object(Bucket="redline-view", Key="team/damaged/manifest.json", Body=b"[1, 2]")
    with TestClient(build_app("s3://redline-view/team"), base_url="http://127.0.0.1:8765") as c:
        listed = {r["id"]: r for r in c.get("/api/runs").json()["runs"]}
        assert set(listed) == {"quickstart-transfer", "transfer-two-victims", "damaged"}
        assert listed["quickstart-transfer"]["state"] == "complete" and listed["quickstart-transfer"]["figures"]
        assert "not a redline manifest" in listed["damaged"]["error"]
        page = c.get("/run", params={"id": "quickstart-transfer", "table": "predictions", "f_detector": "keywords"})
        assert page.status_code == 200 and "keywords" in page.text and "rows · page 1" in page.text
        png = next((runs_root / "quickstart-transfer" / "plots").glob("*.png")).name
        assert c.get("/file", params={"id": "quickstart-transfer", "name": f"plots/{png}"}).content[:4] == b"\x89PNG"
        compare = c.get("/compare", params=[("id", "quickstart-transfer"), ("id", "transfer-two-victims")])
        assert compare.status_code == 200 and "<svg" in compare.text


# --------------------------------------------------------------------------------------------
# In a real browser


def browser():
    """Headless Chromium through chromedriver (Debian's packages; `setup.sh --test` installs them)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        message = "chromium and chromium-driver are not installed (setup.sh --test installs them as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture
def viewer(runs_root):
    """`redline view` itself, as a user starts it (its pages checking running runs every 0.5 s, not 3)."""
    port = free_port()
    env = {**os.environ, "REDLINE_API_KEY": ""}
    proc = subprocess.Popen([str(VENV_BIN / "redline"), "view", str(runs_root), "--port", str(port), "--refresh", "0.5"],
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
        sys.stdout.write(out)


def test_pages_in_a_real_browser(viewer, runs_root, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser()
    errors: list[str] = []

    def shot(name: str) -> None:
        driver.save_screenshot(str(tmp_path / f"{name}.png"))
        if os.environ.get("REDLINE_VIEW_SHOTS"):  # README's screenshots: REDLINE_VIEW_SHOTS=docs pytest -k browser
            driver.save_screenshot(str(Path(os.environ["REDLINE_VIEW_SHOTS"]) / f"view-{name}.png"))
        errors.extend(f"{name}: {e['message']}" for e in driver.get_log("browser") if e["level"] == "SEVERE")

    # a page that reloads between finding an element and reading it: look again, never fail on it
    stale = [StaleElementReferenceException]
    wait = WebDriverWait(driver, 20, ignored_exceptions=stale)
    try:
        # the run list: every run, its state, its figures, the damaged one with its error
        driver.get(viewer + "/")
        every = {p.name for p in runs_root.iterdir() if (p / "manifest.json").is_file()}
        listed = lambda d: {r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "tr.run")}  # noqa: E731
        wait.until(lambda d: listed(d) == every)  # (the list may be reloading: it checks for new runs every 1.7 s)
        rows = {r.get_attribute("data-id"): r for r in driver.find_elements(By.CSS_SELECTOR, "tr.run")}
        pipelines = {run: r.get_attribute("data-pipeline") for run, r in rows.items()}
        assert set(rows) == every
        assert rows["quickstart-attack"].find_element(By.CSS_SELECTOR, "[data-field=state]").text == "complete"
        assert "not valid JSON" in rows["half-written-run"].text
        assert "ASR TAE" in rows["transfer-two-victims"].text and "keywords all" in rows["transfer-two-victims"].text
        shot("runs")

        # a run page: the report with its plots loaded
        rows["quickstart-attack"].find_element(By.CSS_SELECTOR, "a.run-link").click()
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, ".report h1")))
        images = driver.find_elements(By.CSS_SELECTOR, ".report img")
        assert images and all(driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0",
                                                    img) for img in images)
        assert "redline attack report" in driver.find_element(By.CSS_SELECTOR, ".report h1").text
        shot("run")

        # filtering attempts by recipe, then status, changes the rows shown
        before = driver.find_element(By.ID, "row-count").text
        Select(driver.find_element(By.NAME, "f_recipe")).select_by_visible_text("pwws")
        wait.until(lambda d: d.find_element(By.ID, "row-count").text != before)
        after_recipe = driver.find_element(By.ID, "row-count").text
        Select(driver.find_element(By.NAME, "f_status")).select_by_visible_text("success")
        wait.until(lambda d: d.find_element(By.ID, "row-count").text != after_recipe)
        attempts = ds.dataset(runs_root / "quickstart-attack" / "attempts").to_table().to_pylist()
        want = [r for r in attempts if r["recipe"] == "pwws" and r["status"] == "success"]
        assert driver.find_element(By.ID, "row-count").text.startswith(f"{len(want)} of {len(attempts)} rows")
        cells = driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=recipe]")
        assert cells and {c.text for c in cells} == {"pwws"}
        assert {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=status]")} == {"success"}
        assert driver.find_elements(By.CSS_SELECTOR, "#row-table td.diff mark")
        shot("rows")

        # a number range and the column picker narrow the page; the URL holds both; the export takes its rows
        least = sorted(r["queries"] for r in want)[len(want) // 2]
        driver.find_element(By.CSS_SELECTOR, "details#ranges summary").click()
        driver.find_element(By.NAME, "min_queries").send_keys(str(least))
        driver.find_element(By.CSS_SELECTOR, "details#columns summary").click()
        driver.find_element(By.CSS_SELECTOR, "details#columns input[value=victim]").click()  # unticked
        before = driver.find_element(By.ID, "row-count").text
        driver.find_element(By.ID, "apply").click()
        wait.until(lambda d: d.find_element(By.ID, "row-count").text != before)
        ranged = [r for r in want if r["queries"] >= least]
        assert driver.find_element(By.ID, "row-count").text.startswith(f"{len(ranged)} of {len(attempts)} rows")
        assert all(int(c.text) >= least for c in driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=queries]"))
        assert not driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=victim]")
        assert f"min_queries={least}" in driver.current_url and "col=recipe" in driver.current_url
        # a permalink holds what was chosen, not every empty field of the form (issue 53 item 8: ~1,000 characters)
        asked = parse_qsl(urlsplit(driver.current_url).query, keep_blank_values=True)
        assert asked and all(value for _, value in asked), driver.current_url
        export = httpx.get(driver.find_element(By.ID, "export-csv").get_attribute("href"), timeout=30)
        assert [r["id"] for r in csv.DictReader(io.StringIO(export.text))] == [r["id"] for r in ranged]
        shot("ranges")

        # the keyboard: "/" to the search, j / k along the rows, Enter opens the row alone (its permalink)
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        body = driver.find_element(By.TAG_NAME, "body")
        ActionChains(driver).move_to_element(body).click(driver.find_element(By.TAG_NAME, "h1")).perform()
        ActionChains(driver).send_keys("/").perform()
        assert driver.switch_to.active_element.get_attribute("name") == "q"
        driver.switch_to.active_element.send_keys(Keys.ESCAPE)
        driver.execute_script("document.activeElement.blur()")
        ActionChains(driver).send_keys("jjk").perform()
        rows_now = driver.find_elements(By.CSS_SELECTOR, "#row-table tbody tr")
        assert [r.get_attribute("class") for r in rows_now[:2]] == ["current", ""]
        ActionChains(driver).send_keys("j").perform()
        second = rows_now[1].find_element(By.CSS_SELECTOR, "a.permalink").get_attribute("href")
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        wait.until(lambda d: d.find_element(By.ID, "row-count").text.startswith(f"1 of {len(attempts)} rows"))
        assert driver.current_url.split("#")[0] == second.split("#")[0]
        # the system's dark theme is followed (prefers-color-scheme)
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        dark = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "light"}]})
        assert dark == "rgb(21, 22, 27)" and driver.execute_script(
            "return getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"

        # a score run: each detector's confusion matrix, a cell opening exactly its rows
        score = next(run for run, pipeline in pipelines.items() if pipeline == "score")
        driver.get(viewer + "/run?" + urlencode({"id": score}))
        cell = driver.find_elements(By.CSS_SELECTOR, "table.confusion td a")[1]  # label toxic, predicted benign
        n = int(cell.text.replace(",", ""))
        cell.click()
        wait.until(lambda d: d.find_element(By.ID, "row-count").text.startswith(f"{n:,} of "))
        assert {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=label]")} <= {"1"}
        shot("confusion")

        # its per-text view: one row per text, every detector side by side; the texts they disagree on
        driver.get(viewer + "/run?" + urlencode({"id": score}))  # the default table of a score run
        assert driver.find_element(By.CSS_SELECTOR, "nav.tables a.on").text == "per-text"
        heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#row-table th")]
        assert {"score_profanity-check", "pred_profanity-check", "score_keywords", "disagree", "misclassified"} <= set(heads)
        predictions = ds.dataset(runs_root / score / "predictions").to_table().to_pylist()
        verdicts: dict[str, set] = {}
        for p in predictions:
            if p["pred_toxic"] is not None:
                verdicts.setdefault(p["id"], set()).add(p["pred_toxic"])
        split = sum(1 for v in verdicts.values() if len(v) == 2)
        Select(driver.find_element(By.NAME, "f_disagree")).select_by_visible_text("true")
        texts = len({p["id"] for p in predictions})
        wait.until(lambda d: d.find_element(By.ID, "row-count").text.startswith(f"{split:,} of {texts:,} rows"))
        assert {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#row-table td[data-col=disagree]")} <= {"True"}
        shot("per-text")
        # the toxic texts that fool every detector: two choices, no range
        driver.get(viewer + "/run?" + urlencode({"id": score}))
        judged = {p["id"] for p in predictions if p["pred_toxic"] is not None}
        fooled = judged & {p["id"] for p in predictions if p["label"] == 1} - {p["id"] for p in predictions if p["pred_toxic"]}
        Select(driver.find_element(By.NAME, "f_fooled")).select_by_visible_text("every")  # the form is sent at once
        wait.until(lambda d: "f_fooled=every" in d.current_url)
        Select(driver.find_element(By.NAME, "f_label")).select_by_visible_text("toxic")
        wait.until(lambda d: "f_label=toxic" in d.current_url)
        wait.until(lambda d: d.find_element(By.ID, "row-count").text.startswith(f"{len(fooled):,} of {texts:,} rows"))

        # compare two transfer runs: both tables and the grouped bars
        driver.get(viewer + "/?pipeline=transfer")
        for run in ("quickstart-transfer", "transfer-two-victims"):
            driver.find_element(By.CSS_SELECTOR, f"input[value='{run}']").click()
        driver.find_element(By.ID, "compare").click()
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#chart svg")))
        compared = [s.get_attribute("data-id") for s in driver.find_elements(By.CSS_SELECTOR, "section.compared")]
        assert sorted(compared) == ["quickstart-transfer", "transfer-two-victims"]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#chart svg rect[fill]")) >= 5  # 3 + 2 bars, legend
        shot("compare")
        driver.execute_script("document.getElementById('grid').scrollIntoView()")
        assert driver.find_elements(By.CSS_SELECTOR, "#grid tr[data-figure=tae_rate]")  # every figure by run
        shot("compare-grid")

        # one example in full: an attack's successful attempt, its diff and what the run knows of it
        attempts = ds.dataset(runs_root / "quickstart-attack" / "attempts").to_table().to_pylist()
        success = next(a for a in attempts if a["status"] == "success")
        driver.get(viewer + "/row?" + urlencode({"id": "quickstart-attack", "table": "attempts", "row": success["id"]}))
        assert driver.find_elements(By.CSS_SELECTOR, "#row-diff mark, #row-diff del")  # the words the attack changed
        shown = driver.find_element(By.CSS_SELECTOR, "#row-fields td[data-col=perturbed_text]").text
        assert shown.split() == success["perturbed_text"].split()
        shot("row")

        # a phone-width window: the page is no wider than the screen (its tables scroll in their box)
        driver.set_window_size(420, 900)
        for path in ("/", "/run?" + urlencode({"id": "quickstart-attack"}), "/compare?id=quickstart-transfer&id=transfer-two-victims"):
            driver.get(viewer + path)
            width = driver.execute_script("return document.documentElement.scrollWidth")
            inner = driver.execute_script("return window.innerWidth")
            assert width <= inner, f"{path} is {width} px wide in a {inner} px window"
        driver.set_window_size(1400, 1000)

        # a running run's state follows its manifest live (written as a run writes it: whole, by a rename,
        # so a page asking every 0.5 s never reads half a file)
        def put(run: Path, manifest: dict) -> None:
            (run / "manifest.json.tmp").write_text(json.dumps(manifest))
            os.replace(run / "manifest.json.tmp", run / "manifest.json")

        live = runs_root / "attack-in-flight"
        shutil.copytree(runs_root / "quickstart-attack", live, dirs_exist_ok=True)
        for name in ("report.md", "report.html"):
            (live / name).unlink()  # a running run has no report yet
        manifest = json.loads((live / "manifest.json").read_text())
        shards = manifest["partials"]["summary"]["shards"]
        manifest.update(run_name="attack-in-flight", state="running", run_uri=str(live))
        manifest["partials"]["summary"]["shards"] = shards[:1]
        put(live, manifest)
        driver.get(viewer + "/")
        badge = (By.CSS_SELECTOR, "tr[data-id='attack-in-flight'] [data-field=state]")
        progress = (By.CSS_SELECTOR, "tr[data-id='attack-in-flight'] [data-field=progress]")
        assert driver.find_element(*badge).text == "running"
        total = sum(manifest["input_rows"])
        # the shards counted so far, in the order their parts were counted (not shard order: parts finish
        # in whatever order the actors write them)
        one = manifest["input_rows"][shards[0][0]]
        assert driver.find_element(*progress).text.startswith(f"{one:,} of {total:,} rows")
        manifest["partials"]["summary"]["shards"] = shards[:2]
        put(live, manifest)
        two = sum(manifest["input_rows"][shard] for shard, _ in shards[:2])
        WebDriverWait(driver, 30, ignored_exceptions=stale).until(lambda d: d.find_element(*progress).text.startswith(f"{two:,} of {total:,}"))
        driver.get(viewer + "/run?id=attack-in-flight")
        assert driver.find_element(By.ID, "progress").text.startswith(f"{two:,} of {total:,} rows")
        manifest["partials"]["summary"]["shards"] = shards
        put(live, manifest)
        WebDriverWait(driver, 30, ignored_exceptions=stale).until(lambda d: d.find_element(By.ID, "progress").text.startswith(f"{total:,} of"))
        # the run's page reloads when the run ends: its report appears without the user reloading
        driver.get(viewer + "/run?id=attack-in-flight")
        assert "no report yet" in driver.find_element(By.ID, "report").text
        manifest["state"] = "complete"
        for name in ("report.md", "report.html"):
            shutil.copy(runs_root / "quickstart-attack" / name, live / name)
        put(live, manifest)
        WebDriverWait(driver, 30, ignored_exceptions=stale).until(
            lambda d: d.find_element(By.ID, "state").text == "complete"
            and "redline attack report" in d.find_element(By.ID, "report").text)
        driver.get(viewer + "/")
        WebDriverWait(driver, 30, ignored_exceptions=stale).until(lambda d: d.find_element(*badge).text == "complete")
        shot("live")

        # an open run list shows a run that appears: at once when nothing is ticked, else it says so
        def new_run(name: str) -> None:
            shutil.copytree(live, runs_root / name)
            put(runs_root / name, {**manifest, "run_name": name})

        new_run("attack-new-1")
        WebDriverWait(driver, 30, ignored_exceptions=stale).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-id='attack-new-1']"))
        driver.find_element(By.CSS_SELECTOR, "input[value='attack-new-1']").click()
        new_run("attack-new-2")
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "runs-changed").is_displayed())
        assert "1 new run(s)" in driver.find_element(By.ID, "runs-changed").text
        assert driver.find_element(By.CSS_SELECTOR, "input[value='attack-new-1']").is_selected()  # not reloaded
    finally:
        driver.quit()
        for name in ("attack-in-flight", "attack-new-1", "attack-new-2"):
            shutil.rmtree(runs_root / name, ignore_errors=True)
    assert not errors, errors
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["compare-grid.png", "compare.png", "confusion.png", "live.png",
                                                               "per-text.png", "ranges.png", "row.png", "rows.png", "run.png",
                                                               "runs.png"]


def test_an_unknown_table_is_said_never_swapped_for_another(client):
    page = client.get("/run", params={"id": "score-two-detectors", "table": "nope<script>"})
    assert page.status_code == 200
    said = page.text.split('id="rows-error">')[1].split("</p>")[0]
    assert said.startswith("no table &#39;nope&lt;script&gt;&#39; in this run (its tables: ") and "predictions" in said
    assert 'id="row-table"' not in page.text  # no rows of another table in its place
    shown = client.get("/run", params={"id": "score-two-detectors", "table": "predictions"})
    assert 'id="row-table"' in shown.text


def test_a_report_link_appears_only_once_there_is_a_report(client, runs_root, tmp_path):
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    page = client.get("/run", params={"id": "score-two-detectors"}).text
    assert "report.html</a>" in page
    # one "Rows" heading: the viewer's rows; the report's counts have a heading of their own (issue 53 item 8)
    assert re.findall(r"<h[1-6][^>]*>Rows</h[1-6]>", page) == ["<h2>Rows</h2>"] and ">Row counts</h2>" in page
    running = tmp_path / "runs" / "in-flight"
    running.mkdir(parents=True)
    manifest = json.loads((runs_root / "score-two-detectors" / "manifest.json").read_text())
    (running / "manifest.json").write_text(json.dumps({**manifest, "state": "running", "run_name": "in-flight"}))
    with TestClient(build_app(str(tmp_path / "runs")), base_url="http://127.0.0.1:8765") as fresh:
        page = fresh.get("/run", params={"id": "in-flight"}).text
    assert "no report yet" in page and "report.html</a>" not in page
    (running / "report.md").write_text("# half a report\n")  # report.md written, report.html not yet
    with TestClient(build_app(str(tmp_path / "runs")), base_url="http://127.0.0.1:8765") as fresh:
        page = fresh.get("/run", params={"id": "in-flight"}).text
    assert "half a report" in page and "report.html</a>" not in page  # never a link to a file that is not there
