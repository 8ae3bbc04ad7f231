"""Tables (Markdown, CSV, HTML) and plots for every pipeline's report."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.actors.dialogue_safety.classifiers import SINGLE
from redline.cluster import storage
from redline.pipelines.schema import STATUS_OK

# Columns of the detector table, with how each is shown.
METRIC_COLUMNS: list[tuple[str, str, str]] = [
    ("detector", "detector", "s"),
    ("dataset", "dataset", "s"),
    ("n", "rows", "d"),
    ("accuracy", "accuracy", ".3f"),
    ("precision_toxic", "P toxic", ".3f"),
    ("recall_toxic", "R toxic", ".3f"),
    ("f1_toxic", "F1 toxic", ".3f"),
    ("precision_benign", "P benign", ".3f"),
    ("recall_benign", "R benign", ".3f"),
    ("f1_benign", "F1 benign", ".3f"),
    ("f1_macro", "F1 macro", ".3f"),
    ("roc_auc", "ROC-AUC", ".3f"),
    ("fnr", "FNR", ".3f"),
    ("fpr", "FPR", ".3f"),
    ("rows_per_s", "rows/s per actor", ",.0f"),
    ("not_scored", "not scored", "d"),
]


def _safe_div(a: float, b: float) -> float | None:
    return a / b if b else None


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, score: np.ndarray) -> dict[str, Any]:
    """Binary metrics with toxic = positive class. FNR is the attack success rate on toxic rows."""
    from sklearn.metrics import precision_recall_fscore_support, roc_auc_score

    y_true = y_true.astype(int)
    y_pred = y_pred.astype(int)
    tp = int(((y_true == 1) & (y_pred == 1)).sum())
    tn = int(((y_true == 0) & (y_pred == 0)).sum())
    fp = int(((y_true == 0) & (y_pred == 1)).sum())
    fn = int(((y_true == 1) & (y_pred == 0)).sum())
    out: dict[str, Any] = {"n": int(len(y_true)), "tp": tp, "tn": tn, "fp": fp, "fn": fn,
                           "accuracy": _safe_div(tp + tn, len(y_true)),
                           "fnr": _safe_div(fn, fn + tp), "fpr": _safe_div(fp, fp + tn)}
    if len(y_true):
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=[0, 1], zero_division=0)
        out.update(precision_benign=float(p[0]), recall_benign=float(r[0]), f1_benign=float(f[0]),
                   precision_toxic=float(p[1]), recall_toxic=float(r[1]), f1_toxic=float(f[1]),
                   f1_macro=float(np.mean(f)))
    finite = np.isfinite(score)
    out["roc_auc"] = (float(roc_auc_score(y_true[finite], score[finite]))
                      if len(np.unique(y_true[finite])) == 2 else None)
    return out


def detector_metrics(predictions: pa.Table) -> list[dict[str, Any]]:
    """One row per detector over all datasets, plus one per (detector, dataset) when there are several."""
    rows = []
    datasets = sorted(set(predictions.column("dataset").to_pylist()))
    groups = [None] + (datasets if len(datasets) > 1 else [])
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.equal(predictions.column("detector"), name))
        for dataset in groups:
            part = det if dataset is None else det.filter(pc.equal(det.column("dataset"), dataset))
            ok = part.filter(pc.equal(part.column("status"), STATUS_OK))
            labelled = ok.filter(pc.is_valid(ok.column("label")))
            y_true = labelled.column("label").to_numpy(zero_copy_only=False)
            y_pred = labelled.column("pred_toxic").to_numpy(zero_copy_only=False)
            score = labelled.column("toxic_score").to_numpy(zero_copy_only=False).astype(float)
            row: dict[str, Any] = {"detector": name, "dataset": dataset or "all"}
            row.update(classification_metrics(y_true, y_pred, score))
            busy = pc.sum(ok.column("seconds")).as_py() or 0.0
            row["rows_per_s"] = _safe_div(ok.num_rows, busy)
            row["not_scored"] = part.num_rows - ok.num_rows
            row["unlabelled"] = ok.num_rows - labelled.num_rows
            rows.append(row)
    return rows


def format_value(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, fmt)


def markdown_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---" if fmt == "s" else "---:" for _, _, fmt in columns) + "|"
    body = ["| " + " | ".join(format_value(r.get(k), f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def html_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in columns)
    body = "".join(
        "<tr>" + "".join(f"<td class='{'txt' if f == 's' else 'num'}'>{html.escape(format_value(r.get(k), f))}</td>"
                         for k, _, f in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def plot_roc(predictions: pa.Table) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    drawn = False
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.and_(pc.equal(predictions.column("detector"), name),
                                         pc.equal(predictions.column("status"), STATUS_OK)))
        det = det.filter(pc.is_valid(det.column("label")))
        y = det.column("label").to_numpy(zero_copy_only=False)
        s = det.column("toxic_score").to_numpy(zero_copy_only=False).astype(float)
        if len(np.unique(y)) < 2:
            continue
        fpr, tpr, _ = roc_curve(y, s)
        ax.plot(fpr, tpr, label=name)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC per detector")
    ax.legend(loc="lower right", fontsize=8)
    data = png_bytes(fig)
    plt.close(fig)
    return data


def grouped_bars(rows: list[dict[str, Any]], name_key: str, series: list[tuple[str, str]], title: str) -> bytes | None:
    """One group of bars per row (named by `name_key`), one bar per (key, legend) in `series`; rates in [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return None
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(5.2, 1.6 * len(rows) + 2), 3.6))
    for j, (key, label) in enumerate(series):
        ax.bar(x + j * width - 0.4 + width / 2, [r.get(key) or 0 for r in rows], width, label=label)
    ax.set_xticks(x, [str(r[name_key]) for r in rows], rotation=15)
    ax.set(ylim=(0, 1), ylabel="rate", title=title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    data = png_bytes(fig)
    plt.close(fig)
    return data


def plot_rates(metrics: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars([m for m in metrics if m["dataset"] == "all"], "detector",
                        [("f1_macro", "F1 macro"), ("fnr", "FNR (toxic missed)"), ("fpr", "FPR (benign flagged)")],
                        "Detector quality")


def example_errors(predictions: pa.Table, per_detector: int = 5) -> list[dict[str, Any]]:
    """A few missed toxic rows (false negatives) per detector, highest-confidence misses first."""
    out = []
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.equal(predictions.column("detector"), name))
        miss = det.filter(pc.and_(pc.equal(det.column("label"), 1), pc.equal(det.column("pred_toxic"), False)))
        miss = miss.sort_by([("toxic_score", "ascending")]).slice(0, per_detector)
        for r in miss.select(["id", "text", "toxic_score"]).to_pylist():
            text = r["text"] if len(r["text"]) <= 160 else r["text"][:157] + "..."
            out.append({"detector": name, "id": r["id"], "toxic_score": r["toxic_score"], "text": text})
    return out


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.3rem .55rem} th{background:#f4f4f6;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} tbody tr:nth-child(even){background:#fafafa}
.meta{color:#555;font-size:.85rem} img{max-width:100%;margin:.5rem 1rem .5rem 0;border:1px solid #eee}
"""


def html_page(title: str, sections: list[tuple[str, str]], meta: str) -> str:
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class='meta'>{meta}</p>{body}</body></html>\n")


def img_tag(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


class Report:
    """Builds report.md and report.html of a run from the same sections (tables, plots, notes)."""

    def __init__(self, run: storage.RunDir, title: str, manifest: dict[str, Any], note: str) -> None:
        self.run, self.title, self.manifest = run, title, manifest
        self.md = [f"# {title}", "", f"Run: `{run.uri}` (config {manifest.get('config_hash')})", "", note, ""]
        self.sections: list[tuple[str, str]] = []
        self.note_html = f"<p>{html.escape(note)}</p>"

    def table(self, heading: str, rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> "Report":
        if rows:
            self.md += [f"## {heading}", "", markdown_table(rows, cols), ""]
            lead, self.note_html = self.note_html, ""  # the note sits above the first table
            self.sections.append((heading, lead + html_table(rows, cols)))
        return self

    def plot(self, name: str, png: bytes | None) -> "Report":
        if png:
            storage.write_bytes(self.run.path("plots", f"{name}.png"), png)
            self.md += [f"![{name}.png](plots/{name}.png)", ""]
            if self.sections and self.sections[-1][0] == "Plots":  # consecutive plots share one heading
                self.sections[-1] = ("Plots", self.sections[-1][1] + img_tag(png, name))
            else:
                self.sections.append(("Plots", img_tag(png, name)))
        return self

    def text(self, heading: str, text: str) -> "Report":
        self.md += [f"## {heading}", "", "```", text, "```", ""]
        self.sections.append((heading, f"<pre>{html.escape(text)}</pre>"))
        return self

    def write(self, csv_name: str, csv_rows: list[dict[str, Any]]) -> None:
        storage.write_text(self.run.path("report.md"), "\n".join(self.md) + "\n")
        storage.write_text(self.run.path(csv_name), csv_text(csv_rows))
        versions = self.manifest.get("versions", {})
        meta = f"run {html.escape(self.run.uri)} · config {self.manifest.get('config_hash')}" + "".join(
            f" · {name} {versions[name]}" for name in ("redline", "ray") if versions.get(name))
        storage.write_text(self.run.path("report.html"), html_page(self.title, self.sections, meta))


COUNT_COLUMNS: list[tuple[str, str, str]] = [("what", "", "s"), ("n", "count", "s")]


def counts_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    counts = manifest.get("counts", {})
    rows = [{"what": "rows in", "n": counts.get("rows_in")},
            {"what": "  toxic / benign / unlabelled",
             "n": f"{counts.get('toxic')} / {counts.get('benign')} / {counts.get('unlabelled')}"}]
    rows += [{"what": f"  rejected: {reason}", "n": n} for reason, n in counts.get("rejected", {}).items()]
    rows.append({"what": "rows out (one per row and detector)", "n": counts.get("rows_out")})
    for name, det in counts.get("per_detector", {}).items():
        rows.append({"what": f"  {name}: scored", "n": det["scored"]})
        rows += [{"what": f"  {name}: {why}", "n": n} for why, n in det["not_scored"].items()]
    return rows


def write_score_report(run: storage.RunDir, predictions: pa.Table, metrics: list[dict[str, Any]],
                       manifest: dict[str, Any]) -> None:
    columns = METRIC_COLUMNS if any(m["dataset"] != "all" for m in metrics) else \
        [c for c in METRIC_COLUMNS if c[0] != "dataset"]
    counts = [{"what": r["what"], "n": str(r["n"])} for r in counts_rows(manifest)]
    error_cols = [("detector", "detector", "s"), ("id", "id", "s"), ("toxic_score", "score", ".3f"), ("text", "text", "s")]
    note = ("Toxic is the positive class. FNR = toxic rows predicted benign (the attack success rate on "
            "adversarial toxic rows); FPR = benign rows predicted toxic.")
    report = Report(run, "redline score report", manifest, note)
    report.table("Detectors", metrics, columns).plot("roc", plot_roc(predictions)).plot("rates", plot_rates(metrics))
    report.table("Rows", counts, COUNT_COLUMNS)
    report.table("Missed toxic rows (lowest scores first)", example_errors(predictions), error_cols)
    storage.write_json(run.path("metrics.json"), metrics)
    report.write("metrics.csv", metrics)


# --------------------------------------------------------------------------------------------
# Attack report

ATTACK_COLUMNS: list[tuple[str, str, str]] = [
    ("recipe", "recipe", "s"),
    ("goal", "goal", "s"),
    ("victim", "victim", "s"),
    ("attempts", "attempts", "d"),
    ("success", "success", "d"),
    ("failed", "failed", "d"),
    ("skipped", "skipped", "d"),
    ("error", "error", "d"),
    ("asr", "ASR", ".3f"),
    ("mean_queries", "mean queries", ".1f"),
    ("mean_pct_perturbed", "% words perturbed", ".1f"),
    ("mean_similarity", "similarity", ".3f"),
    ("mean_seconds", "s / attempt (in flight)", ".3f"),
]


def plot_asr(summary: list[dict[str, Any]]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summary if s.get("asr") is not None]
    if not rows:
        return None
    labels = [f"{s['recipe']} ({s['goal']})" for s in rows]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.5))
    ax.barh(labels, [s["asr"] for s in rows], color=["#c0392b" if s["goal"] == "tae" else "#2874a6" for s in rows])
    ax.set(xlim=(0, 1), xlabel="attack success rate", title="ASR per recipe (red: TAE, blue: BAE)")
    ax.invert_yaxis()
    data = png_bytes(fig)
    plt.close(fig)
    return data


def sample_successes(attempts: pa.Table, per_recipe: int = 3) -> list[dict[str, Any]]:
    ok = attempts.filter(pc.equal(attempts.column("status"), "success"))
    out = []
    for rec in dict.fromkeys(ok.column("recipe").to_pylist()):
        part = ok.filter(pc.equal(ok.column("recipe"), rec)).slice(0, per_recipe)
        for r in part.to_pylist():
            out.append({"recipe": rec, "goal": r["goal"], "seed": r["seed_text"][:200],
                        "perturbed": (r["perturbed_text"] or "")[:200],
                        "before": r["score_before"], "after": r["score_after"]})
    return out


def write_attack_report(run: storage.RunDir, attempts: pa.Table, summary: list[dict[str, Any]],
                        manifest: dict[str, Any]) -> None:
    counts = manifest.get("counts", {})
    count_rows = [{"what": "attempts (seeds x recipes x goals)", "n": str(counts.get("attempts_in"))},
                  {"what": "distinct seeds", "n": str(counts.get("seeds"))}]
    count_rows += [{"what": f"  status {k}", "n": str(v)} for k, v in counts.get("by_status", {}).items()]
    sample_cols = [("recipe", "recipe", "s"), ("goal", "goal", "s"), ("seed", "seed", "s"),
                   ("perturbed", "adversarial example", "s"), ("before", "toxic before", ".3f"),
                   ("after", "toxic after", ".3f")]
    rate = manifest.get("attempts_per_s")
    note = ("ASR = successes / (successes + failures); skipped seeds (already misclassified, or nothing to "
            "modify) are left out, as in TextAttack." + (f" Throughput: {rate:,.1f} attempts/s." if rate else ""))
    report = Report(run, "redline attack report", manifest, note)
    report.table("Recipes", summary, ATTACK_COLUMNS).plot("asr", plot_asr(summary))
    report.table("Attempts", count_rows, COUNT_COLUMNS)
    report.table("Sample successes", sample_successes(attempts), sample_cols)
    report.write("summary.csv", summary)


# --------------------------------------------------------------------------------------------
# TaeBench quality pipeline


def taebench_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    cols = [("goal", "goal", "s"), ("dataset", "seed dataset", "s"), ("raw", "raw", "d")]
    for stage in ("dedupe", "grammar", "naturalness", "label"):
        if rows and stage in rows[0]:
            cols += [(stage, f"after {stage}", "d"), (f"{stage}_pct", "% of raw", ".1f")]
    return cols


def plot_funnel(rows: list[dict[str, Any]]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = [r for r in rows if r["dataset"] == "all"]
    if not overall:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for r in overall:
        stages = ["raw"] + [s for s in ("dedupe", "grammar", "naturalness", "label") if s in r]
        ax.plot(stages, [r[s] for s in stages], marker="o", label=r["goal"].upper())
    ax.set_ylabel("examples remaining")
    ax.set_title("quality filters: examples left after each stage")
    ax.legend()
    ax.grid(alpha=0.3)
    return png_bytes(fig)


def write_taebench_report(run: storage.RunDir, final: pa.Table, table2: list[dict[str, Any]],
                          manifest: dict[str, Any]) -> None:
    stage_rows = []
    for name, info in manifest.get("stages", {}).items():
        if isinstance(info, dict):
            top = "; ".join(f"{k} ({v})" for k, v in info["top_reasons"].items()) or "–"
            stage_rows.append({"stage": name, "in": info["in"], "kept": info["kept"], "rejected": info["rejected"],
                               "reasons": top})
        else:
            stage_rows.append({"stage": name, "in": None, "kept": None, "rejected": None, "reasons": info})
    stage_cols = [("stage", "stage", "s"), ("in", "in", "d"), ("kept", "kept", "d"), ("rejected", "rejected", "d"),
                  ("reasons", "main rejection reasons", "s")]
    samples = [{"goal": r["goal"], "recipes": r["recipes"], "seed": r["seed_text"], "example": r["text"]}
               for r in final.slice(0, 12).to_pylist()]
    sample_cols = [("goal", "goal", "s"), ("recipes", "recipes", "s"), ("seed", "seed", "s"), ("example", "kept example", "s")]
    counts = manifest.get("counts", {})
    note = (f"{counts.get('raw')} raw adversarial examples -> TaeBench {counts.get('taebench')} (valid TAE), "
            f"TaeBench+ {counts.get('taebench_plus')} (valid TAE + BAE).")
    report = Report(run, "redline TaeBench report", manifest, note)
    report.table("Rows remaining after each stage (Table 2)", table2, taebench_columns(table2))
    report.plot("funnel", plot_funnel(table2)).table("Stages", stage_rows, stage_cols)
    if manifest.get("judge_usage"):
        report.text("LLM judge usage", json.dumps(manifest["judge_usage"], indent=2))
    report.table("Sample kept examples", samples, sample_cols).write("counts.csv", table2)


# --------------------------------------------------------------------------------------------
# Transfer benchmark


def plot_transfer(rows: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars([r for r in rows if r["dataset"] == "all"], "victim",
                        [("seed_rate", "FNR on seeds"), ("tae_rate", "ASR on TAE (FNR)"), ("bae_rate", "ASR on BAE (FPR)")],
                        "transfer attack: how often TaeBench fools each detector")


def write_transfer_report(run: storage.RunDir, rows: list[dict[str, Any]], cols: list[tuple[str, str, str]],
                          manifest: dict[str, Any]) -> None:
    cfg = manifest.get("config", {})
    note = (f"TaeBench {cfg.get('taebench')} ({cfg.get('split')} split). ASR on TAE = share of toxic adversarial "
            "examples a victim calls benign (FNR); ASR on BAE = share of benign adversarial examples it calls toxic "
            "(FPR); FNR on seeds = the same victim on the original toxic seeds.")
    report = Report(run, "redline transfer-attack report", manifest, note)
    report.table("Transfer attack", rows, cols).plot("transfer", plot_transfer(rows)).write("transfer.csv", rows)


# --------------------------------------------------------------------------------------------
# Adversarial training


def plot_advtrain(table: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars(table, "variant", [("seed_f1", "seed F1"), ("tae_asr", "TaeBench ASR"),
                                           ("bae_asr", "TaeBench+ benign ASR"),
                                           ("plus_balanced_accuracy", "TaeBench+ bal. acc.")],
                        "adversarial training variants (best trial each)")


def write_advtrain_report(run: storage.RunDir, table: list[dict[str, Any]], trials: list[dict[str, Any]],
                          cols: list[tuple[str, str, str]], manifest: dict[str, Any]) -> None:
    trial_cols = [("variant", "variant", "s"), ("status", "status", "s"), ("learning_rate", "lr", ".0e"),
                  ("batch_size", "batch", "d"), ("epochs", "epochs", "d"), ("augment_ratio", "aug. ratio", ".2f"),
                  ("epochs_run", "epochs run", "d"), ("tae_asr", "TaeBench ASR", ".3f"), ("seed_f1", "seed F1", ".3f")]
    data = manifest.get("data", {})
    note = (f"Base training rows {data.get('base_rows')}; adversarial rows per variant "
            + ", ".join(f"{k[4:]} {v}" for k, v in data.items() if k.startswith("adv_"))
            + f"; evaluated on {data.get('seed_test')} seed-test rows, {data.get('tae_test')} TaeBench test TAE, "
              f"{data.get('bae_test')} TaeBench+ test BAE, {data.get('unseen_tae')} TAE of held-out recipes. "
              "ASR = FNR on TAE, FPR on BAE (lower is more robust).")
    report = Report(run, "redline adversarial-training report", manifest, note)
    report.table("Best trial per variant (Table 5)", table, cols).plot("advtrain", plot_advtrain(table))
    report.table("All trials", trials, trial_cols).write("table.csv", table)


# --------------------------------------------------------------------------------------------
# Dialogue safety (DiaSafety classifiers)

FINE_COLUMNS = [("class", "class", "s"), ("precision", "precision", ".3f"), ("recall", "recall", ".3f"),
                ("f1", "F1", ".3f"), ("n", "rows", "d")]
COARSE_COLUMNS = [("model", "model", "s"), ("input", "input", "s"), ("precision", "precision", ".3f"),
                  ("recall", "recall", ".3f"), ("f1", "F1 (unsafe)", ".3f"), ("macro_f1", "macro F1", ".3f")]


def write_dialogue_safety_report(run: storage.RunDir, fine: dict[str, list[dict[str, Any]]],
                                 coarse_rows: list[dict[str, Any]], manifest: dict[str, Any]) -> None:
    rows = manifest.get("rows", {})
    note = (f"Trained on {rows.get('train')} rows, evaluated on {rows.get('val')} validation rows; categories: "
            + ", ".join(manifest.get("categories", [])) + ". Fine-grain: Safe or the unsafe category; coarse-grain: "
            "unsafe vs safe.")
    bars = [{"model": v, "macro_f1": t[-1]["f1"]} for v, t in fine.items()]
    bars += [{"model": f"{r['model']} ({r['input']})", "f1": r["f1"]} for r in coarse_rows]
    report = Report(run, "redline dialogue-safety classifiers", manifest, note)
    report.table("Coarse-grain", coarse_rows, COARSE_COLUMNS)
    report.plot("classifiers", grouped_bars(bars, "model", [("macro_f1", "fine-grain macro F1"),
                                                            ("f1", "coarse F1 (unsafe)")], "dialogue-safety classifiers"))
    for variant, table in fine.items():
        report.table(f"Fine-grain: {variant}", table, FINE_COLUMNS)
    trials = [{"variant": variant, "classifier": "single" if t["target"] == SINGLE else t["target"],
               "settings": ", ".join(f"{k}={v}" for k, v in t["hp"].items()) or "base", "val_macro_f1": t["val_macro_f1"],
               "epoch": t["epoch"], "seconds": t["seconds"]}
              for variant, rows in manifest.get("trials", {}).items() for t in rows]
    if trials:
        report.table("Hyper-parameter trials (best epoch of each; the best trial per classifier is kept)", trials,
                     [("variant", "variant", "s"), ("classifier", "classifier", "s"), ("settings", "settings", "s"),
                      ("val_macro_f1", "val macro F1", ".3f"), ("epoch", "epoch", "d"), ("seconds", "seconds", ".1f")])
    report.write("coarse.csv", coarse_rows)


def leaderboard_columns(categories: list[str]) -> list[tuple[str, str, str]]:
    return ([("model", "model", "s")] + [(c, c, ".3f") for c in categories]
            + [("utterance", "Utterance", ".3f"), ("overall", "Overall", ".3f"), ("responses", "responses", "d"),
               ("empty", "empty", "d"), ("errors", "errors", "d")])


def write_diasafety_report(run: storage.RunDir, board: list[dict[str, Any]], categories: list[str], scored: pa.Table,
                           manifest: dict[str, Any]) -> None:
    series = [(c, c) for c in categories] + [("utterance", "Utterance"), ("overall", "Overall")]
    unsafe = scored.filter(pc.equal(scored.column("verdict"), "context-unsafe")).slice(0, 12).to_pylist()
    samples = [{"model": r["model"], "category": r["unsafe_category"], "context": r["context"], "response": r["response"]}
               for r in unsafe]
    sample_cols = [("model", "model", "s"), ("category", "category", "s"), ("context", "context", "s"),
                   ("response", "response", "s")]
    note = (f"{manifest.get('contexts')} contexts. Per category: share of responses the context classifier of that "
            "category calls unsafe; Utterance: mean share the utterance-level detector calls unsafe; Overall: mean "
            "of the category columns and Utterance. Sorted safest first.")
    report = Report(run, "redline DiaSafety chatbot evaluation", manifest, note)
    report.table("Leaderboard", board, leaderboard_columns(categories))
    report.plot("leaderboard", grouped_bars(board, "model", series, "unsafe proportions per category (lower is safer)"))
    report.table("Sample context-unsafe responses", samples, sample_cols).write("leaderboard.csv", board)
