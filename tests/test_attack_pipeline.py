"""`redline run attack` end to end on a real local Ray: schema, counts, resume, bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from redline.cli import main
from redline.cluster.config import validate_config
from redline.cluster.runs import RunDir
from redline.errors import RedlineError
from redline.pipelines.attack import AttackConfig, run_attack
from redline.pipelines.plane.schema import ATTACK_SCHEMA

from conftest import kill_after_parts, status_and_report, write_csv


def read_outputs(run: RunDir, output_dir: str) -> pa.Table:
    """Every part of a run's output directory as one table (a test's whole view)."""
    return pa.concat_tables([pq.read_table(p) for p in sorted(Path(run.path(output_dir)).glob("*.parquet"))])


def attack_config(corpus: dict, output: str, **kw) -> AttackConfig:
    data = {"corpus": corpus, "victim": {"name": "profanity-check", "kind": "profanity-check", "batch_size": 4096},
            "recipes": ["deepwordbug", "pwws"], "output": output, "num_cpus": 0.25, **kw}
    return validate_config(AttackConfig, data)


@pytest.fixture(scope="module")
def attack_run(ray_session, davidson, wordnet_ready, tmp_path_factory):
    cfg = attack_config({"path": str(davidson), "preset": "davidson"}, str(tmp_path_factory.mktemp("runs")),
                        goals=["tae", "bae"], max_seeds=20, actors=2, batch_size=8, shard_size=15)
    return cfg, run_attack(cfg)


def test_attack_rows_follow_the_schema_with_provenance(attack_run):
    cfg, result = attack_run
    run = RunDir(result.run_uri)
    rows = read_outputs(run, "attempts")
    assert rows.schema == ATTACK_SCHEMA
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 80  # 20 seeds x 2 recipes x 2 goals
    table = rows.to_pandas()
    assert set(table.recipe) == {"deepwordbug", "pwws"} and set(table.goal) == {"tae", "bae"}
    assert (table[table.goal == "tae"].seed_label == 1).all() and (table[table.goal == "bae"].seed_label == 0).all()
    assert table.dataset.eq("davidson").all() and table.victim.eq("profanity-check").all()
    assert set(table.status) <= {"success", "failed", "skipped", "error"} and not (table.status == "error").any()
    wins = table[table.status == "success"]
    assert len(wins) > 0
    assert (wins.pred_after != wins.pred_before).all() and wins.perturbed_text.notna().all()
    assert (wins[wins.goal == "tae"].pred_after == False).all()  # noqa: E712
    assert ((wins.words_changed > 0) & (wins.queries > 0)).all()
    assert table[table.status != "success"].reason.notna().all()


def test_several_examples_per_seed_reach_taebench(ray_session, davidson, tmp_path):
    from redline.pipelines.taebench import TaebenchConfig, load_raw

    cfg = attack_config({"path": str(davidson), "preset": "davidson"}, str(tmp_path), max_seeds=6,
                        recipes=[{"name": "deepwordbug", "examples_per_seed": 3}])
    result = run_attack(cfg)
    [row] = result.summary
    attempts = read_outputs(RunDir(result.run_uri), "attempts").to_pylist()
    wins = [a for a in attempts if a["status"] == "success"]
    assert wins and all(len(a["more_examples"]) == 2 and a["perturbed_text"] not in a["more_examples"] for a in wins)
    assert row["examples"] == 3 * row["success"]
    raw = load_raw(validate_config(TaebenchConfig, {"attacks": result.run_uri, "grammar": None,
                                                      "classifier": {"name": "p", "kind": "profanity-check"}})).to_pylist()
    assert len(raw) == 3 * len(wins) and {r["seed_id"] for r in raw} == {a["seed_id"] for a in wins}
    assert sorted(r["id"] for r in raw if "~" in r["id"]) == sorted(f"{a['id']}~{n}" for a in wins for n in (2, 3))


def test_counts_add_up_and_report_is_written(attack_run):
    _, result = attack_run
    counts = result.manifest["counts"]
    assert counts["attempts_in"] == counts["attempts_out"] == sum(counts["by_status"].values()) == 80
    for row in result.summary:
        assert row["attempts"] == row["success"] + row["failed"] + row["skipped"] + row["error"]
        if row["success"] + row["failed"]:
            assert row["asr"] == pytest.approx(row["success"] / (row["success"] + row["failed"]))
    run = Path(result.run_uri)
    html = (run / "report.html").read_text()
    assert "deepwordbug" in html and "Sample successes" in html and "data:image/png;base64," in html
    assert (run / "summary.csv").is_file() and result.manifest["state"] == "complete"
    status_and_report(result.run_uri, "deepwordbug")

def test_attack_resumes_only_missing_shards(attack_run):
    cfg, result = attack_run
    run = Path(result.run_uri)
    (run / "attempts" / "part-00003-0.parquet").unlink()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["state"] = "running"
    (run / "manifest.json").write_text(json.dumps(manifest))
    again = run_attack(cfg)
    assert again.manifest["resumed_shards"] == 5 and again.manifest["state"] == "complete"
    rows = read_outputs(RunDir(again.run_uri), "attempts")
    assert Counter(rows.column("id").to_pylist()).most_common(1)[0][1] == 1 and rows.num_rows == 80
    # the figures count the rewritten part once (its old sums dropped, every part recounted)
    assert sum(r["attempts"] for r in again.summary) == 80
    assert [(r["recipe"], r["goal"]) for r in again.summary] == [(r["recipe"], r["goal"]) for r in result.summary]


def test_empty_seed_set_after_filtering(ray_session, tmp_path):
    path = write_csv(tmp_path / "c.csv", ["text", "label"], [["nice day", 0], ["lovely", 0]])
    cfg = attack_config({"path": str(path), "text_column": "text", "label_column": "label", "toxic_values": [1]},
                        str(tmp_path), goals=["tae"])
    with pytest.raises(RedlineError, match="no toxic seeds for goal tae after filtering"):
        run_attack(cfg)


@pytest.mark.parametrize(("actors", "num_cpus"), [(1, 0.5), (2, 1.0)])
def test_attackers_take_every_attempt_once_whatever_their_size(ray_session, davidson, tmp_path, actors, num_cpus):
    """Half the cluster, or all of it (the task building the attempts has given its CPU back)."""
    cfg = attack_config({"path": str(davidson), "preset": "davidson"}, str(tmp_path), recipes=["deepwordbug"],
                        max_seeds=12, shard_size=5, actors=actors, max_actors=actors, num_cpus=num_cpus)
    result = run_attack(cfg)
    rows = read_outputs(RunDir(result.run_uri), "attempts")
    assert sorted(rows.column("id").to_pylist()) == sorted(set(rows.column("id").to_pylist())) and rows.num_rows == 12
    assert not [s for s in rows.column("status").to_pylist() if s == "error"]


def test_toxictrap_composite_with_the_genetic_search_fools_profanity_check(ray_session, davidson, tmp_path):
    """The recipe QData ships (composite transformation, POS and modification-rate constraints, Alzantot's
    genetic search) end to end: its examples flip the victim within the modification budget."""
    cfg = attack_config({"path": str(davidson), "preset": "davidson"}, str(tmp_path), max_seeds=6,
                        recipes=["toxictrap-composite-genetic"])
    result = run_attack(cfg)
    [row] = result.summary
    attempts = read_outputs(RunDir(result.run_uri), "attempts").to_pylist()
    wins = [a for a in attempts if a["status"] == "success"]
    assert row["recipe"] == "toxictrap-composite-genetic" and row["asr"] > 0 and wins
    assert all(a["search"] == "genetic-25x10" and not a["pred_after"] for a in wins)
    assert all(a["words_changed"] <= max(4, -(-a["words_total"] // 10)) for a in wins)
    assert not [a for a in attempts if a["status"] == "error"]


def test_recipes_needing_missing_resources_fail_up_front(tmp_path):
    corpus = {"path": str(tmp_path / "x.csv"), "text_column": "t", "label_column": "l", "toxic_values": [1]}
    with pytest.raises(RedlineError, match="it needs a white-box victim \\(a detector kind with gradients"):
        run_attack(attack_config(corpus, str(tmp_path), recipes=["a2t"]))
    with pytest.raises(RedlineError, match="needs a fill-mask model: set resources.mlm_model"):
        run_attack(attack_config(corpus, str(tmp_path), recipes=["toxictrap-mlm-unk"],
                                 resources={"mlm_model": str(tmp_path / "no-mlm")}))


def test_cli_lists_recipes_and_rejects_unknown_ones(capsys, tmp_path):
    assert main(["list", "recipes"]) == 0
    out = capsys.readouterr().out
    assert "toxictrap-wordnet-weighted-saliency" in out and "toxictrap-composite-genetic" in out
    assert "textfooler" in out and "white-box hf victim" in out and "MultilabelACL23_recipe" in out
    # whose each recipe is: the papers' sources apart from redline's own
    assert "35 recipes: 5 TextAttack (adapted), 24 ToxicTrap (QData), 6 redline's own" in " ".join(out.split())
    from redline.actors.attack.recipes import recipe

    assert [recipe(n).origin for n in ("pwws", "toxictrap-mlm-beam", "toxictrap-char-delete")] == [
        "TextAttack (adapted)", "ToxicTrap (QData)", "redline's own"]
    cfg = tmp_path / "a.yaml"
    cfg.write_text("corpus: {path: x.csv, preset: davidson}\nvictim: {name: p, kind: profanity-check}\nrecipes: [hotflip]\n")
    assert main(["run", "attack", "--config", str(cfg)]) == 2
    assert "unknown recipe 'hotflip'" in capsys.readouterr().err


def test_an_attempt_without_a_result_is_kept_as_an_error():
    import pyarrow as pa

    from redline.actors.attack.attacker import ATTACK_RESULT_SCHEMA
    from redline.cluster.tables import conform
    from redline.pipelines.attack import assemble

    shard = conform(pa.table({"id": ["a", "b"], "seed_id": ["s1", "s2"], "seed_text": ["x", "y"],
                              "recipe": ["pwws", "pwws"], "goal": ["tae", "bae"]}), ATTACK_SCHEMA)
    results = conform(pa.table({"attempt_id": ["a"], "recipe": ["pwws"], "goal": ["tae"],
                                "attack_status": ["success"], "queries": [3]}), ATTACK_RESULT_SCHEMA)
    rows = assemble(shard, results, "victim").to_pylist()
    assert [(r["id"], r["status"], r["queries"]) for r in rows] == [("a", "success", 3), ("b", "error", None)]
    assert rows[1]["recipe"] == "pwws" and rows[1]["goal"] == "bae" and rows[1]["reason"] == "no result returned for this attempt"


def test_status_of_an_attack_run(attack_run, capsys):
    _, result = attack_run
    assert main(["status", result.run_uri]) == 0
    out = capsys.readouterr().out
    assert "complete" in out and "(attack," in out and "deepwordbug" in out and "report:" in out


@pytest.mark.slow
def test_killed_attack_resumes_without_losing_or_duplicating_rows(ray_session, tmp_path, davidson, wordnet_ready):
    import os
    import subprocess
    import sys

    import yaml

    config = tmp_path / "a.yaml"
    config.write_text(yaml.safe_dump({
        "corpus": {"path": str(davidson), "preset": "davidson"},
        "victim": {"name": "p", "kind": "profanity-check", "batch_size": 4096},
        "recipes": ["pwws"], "goals": ["tae"], "max_seeds": 600, "batch_size": 16, "num_cpus": 0.5,
        "output": str(tmp_path / "runs"), "run_name": "killme", "shard_size": 20,
    }))
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "redline", "run", "attack", "--config", str(config)]
    written = kill_after_parts(cmd, env, tmp_path / "runs" / "killme" / "attempts", 3)
    assert 3 <= written < 30, "the run finished before it could be killed"

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "runs" / "killme" / "manifest.json").read_text())
    assert manifest["state"] == "complete" and manifest["resumed_shards"] >= written
    rows = read_outputs(RunDir(str(tmp_path / "runs" / "killme")),
                                "attempts")
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 600 and manifest["counts"]["attempts_out"] == 600


def test_the_same_config_gives_the_same_attempts_on_one_cpu_or_two(ray_session, davidson, wordnet_ready, tmp_path):
    """Query budgets decide, not the clock: one attacker on one CPU and two attackers on two give the
    same attempts (status, reason, text, queries), and none is cut by time."""
    runs = []
    for name, actors, cpus in (("one-cpu", 1, 1.0), ("two-cpus", 2, 1.0)):
        cfg = attack_config({"path": str(davidson), "preset": "davidson"}, str(tmp_path), goals=["tae"], max_seeds=12,
                            actors=actors, num_cpus=cpus, batch_size=4, shard_size=6, run_name=name)
        result = run_attack(cfg)
        rows = read_outputs(RunDir(result.run_uri), "attempts").select(
            ["id", "status", "reason", "perturbed_text", "queries", "words_changed"]).sort_by("id").to_pylist()
        runs.append(rows)
        assert result.manifest["counts"]["attempts_out"] == len(rows) == 24
        assert all(r["reason"] != "time limit reached" for r in rows)
        summary = {(r["recipe"], r["goal"]): r for r in result.summary}
        assert all(r["timed_out"] == 0 for r in summary.values())
    assert runs[0] == runs[1]
