"""`redline quickstart`: the main job on embedded defaults (local Ray, local files, offline models,
a bundled sample), and the smaller chains; it ends by printing where the runs are."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from redline.cli.apps import app
from redline.cli.runs import ForceOpt
from redline.cli.show import console, err_console, show_result, verbose
from redline.cluster.net import free_port
from redline.cluster.runs import finished_run
from redline.errors import RedlineError
from redline.pipelines import quickstart as qs
from redline.pipelines.registry import pipeline


def run_chain(output: str, *, force: bool = False, verbose: bool = False, say: Any = print) -> dict[str, Any]:
    """Attack profanity-check on the sample, filter the results with an LLM judge served by redline's
    own generation service and a tiny classifier, then benchmark three other detectors by transfer."""
    from redline.pipelines.attack import run_attack
    from redline.pipelines.taebench import run_taebench
    from redline.pipelines.transfer import run_transfer
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    models = Path(output) / "models"
    classifier = qs.quickstart_model(models)
    judge_model = qs.quickstart_judge_model(models)
    filter_model = qs.quickstart_filter_model(models)
    say("1/4 attacking profanity-check (TAE and BAE, 3 recipes)")
    attack = run_attack(qs.quickstart_attack_config(output), force=force, verbose=verbose)
    def taebench_config(judge_url: str) -> Any:
        return qs.quickstart_taebench_config(output, attack.run_uri, judge_url, filter_model)

    # the judge's address is where the run asks, not what it computes: a finished run of this config is
    # reused whatever it was, and needs no judge served
    unserved = taebench_config("http://127.0.0.1:1/v1")
    if not force and finished_run("taebench", unserved, unserved.output, unserved.run_name):
        say("2/4 the tiny LLM judge: not needed, the quality filters ran before")
        say("3/4 quality filters: dedupe, grammar, LLM judge AND classifier")
        taebench = run_taebench(unserved, verbose=verbose)
    else:
        say("2/4 serving the tiny LLM judge on Ray Serve (OpenAI-compatible API)")
        for attempt in range(3):  # a free port can be taken by another process before Serve binds it
            serve_cfg = ServeConfig.model_validate({
                "port": free_port(), "app_name": "quickstart-judge", "api_key_env": None,
                "generators": [{"name": "tiny-judge", "model": str(judge_model), "num_cpus": 0.25}]})
            try:
                state = runner.start(serve_cfg, verbose=verbose, announce=lambda _: None)
                break
            except runner.PortTaken:
                if attempt == 2:
                    raise
        try:
            say("3/4 quality filters: dedupe, grammar, LLM judge AND classifier")
            taebench = run_taebench(taebench_config(state["url"] + "/v1"), force=force, verbose=verbose)
        finally:
            runner.shutdown()
    say("4/4 transfer attack on three detectors")
    transfer = run_transfer(qs.quickstart_transfer_config(output, taebench.run_uri, classifier), force=force,
                            verbose=verbose)
    return {"attack": attack, "taebench": taebench, "transfer": transfer}


@app.command()
def quickstart(
    what: Annotated[str, typer.Argument(help="taebench (default): the whole chain; score: detectors on a labelled "
                                             "sample; attack: TAE/BAE recipes only; diasafety: chatbot "
                                             "evaluation; egregious: gibbs-enum trigger search; card: a safety "
                                             "card of a tiny chat model and its guard.")] = "taebench",
    output: Annotated[str, typer.Option(help="Where run directories and the tiny models go.")] = "redline-runs",
    force: ForceOpt = False,
) -> None:
    """The main job on embedded defaults: local Ray, local files, offline models, a bundled sample.

    `taebench` runs the TaeBench chain in a few minutes: attack profanity-check on the bundled
    sample (toxic and benign seeds, 3 recipes), filter the adversarial examples (dedupe, grammar
    when a LanguageTool server is set, an LLM judge served by redline's own OpenAI-compatible
    generation service with a tiny model trained on the spot, AND a tiny classifier), then
    benchmark three detectors by transfer attack. `score` scores the sample's test split with
    three detectors; `attack` runs only the attack. `diasafety` trains tiny DiaSafety context
    classifiers on a slice of the dataset (REDLINE_DIASAFETY_DIR), evaluates a tiny dialogue model
    and prints the leaderboard. `egregious` trains a tiny LSTM seq2seq and LM on a slice of
    DiaSafety pairs (REDLINE_DIASAFETY_DIR) and prints gibbs-enum hit rates per target list.
    `card` writes a safety card (`redline eval`) of a tiny dialogue model guarded by the tiny
    classifier: TaeBench against the guard, DiaSafety two-step evaluation, triggers on the model.
    Every variant ends by printing the `redline view` command that opens its runs in a browser.
    """
    def say(message: str) -> None:
        err_console.print(f"[bold]{message}[/bold]")

    if what == "score":
        model_dir = qs.quickstart_model(Path(output) / "models")
        show_result(pipeline("score"), pipeline("score").run(qs.quickstart_config(output, model_dir), force=force,
                                                             verbose=verbose()))
    elif what == "attack":
        show_result(pipeline("attack"), pipeline("attack").run(qs.quickstart_attack_config(output), force=force,
                                                               verbose=verbose()))
    elif what == "taebench":
        runs = run_chain(output, force=force, verbose=verbose(), say=say)
        show_result(pipeline("attack"), runs["attack"])
        counts = runs["taebench"].manifest["counts"]
        console.print(f"TaeBench: {counts['raw']} raw -> {counts['taebench']} TAE kept, "
                      f"{counts['taebench_plus']} in TaeBench+ (report: {runs['taebench'].report_html})")
        show_result(pipeline("transfer"), runs["transfer"])
    elif what == "diasafety":
        runs = qs.run_diasafety_chain(output, force=force, verbose=verbose(), say=say)
        for row in runs["classifiers"].summary:
            console.print(f"classifier {row['model']} ({row['input']}): coarse F1 {row['f1']:.3f}")
        show_result(pipeline("diasafety"), runs["leaderboard"])
    elif what == "egregious":
        show_result(pipeline("egregious"), qs.run_egregious_chain(output, force=force, verbose=verbose(), say=say))
    elif what == "card":
        show_result(pipeline("eval"), qs.run_card_chain(output, force=force, verbose=verbose(), say=say))
    else:
        raise RedlineError(f"unknown quickstart '{what}' (known: taebench, score, attack, diasafety, egregious, card)")
    console.print(f"browse the runs in a web browser: [bold]redline view {output}[/bold]", highlight=False,
                  soft_wrap=True)
