"""`redline list ...`: what is registered (detector kinds, providers, recipes, categories, pipelines)."""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from redline.cli.apps import list_app
from redline.cli.show import console


@list_app.command("detectors")
def list_detectors() -> None:
    """Detector kinds usable as `kind:` in a config, with their own options."""
    from redline.actors.detectors import detector_kinds

    table = Table(title="detector kinds", show_lines=False)
    table.add_column("kind", style="bold")
    table.add_column("what it is")
    table.add_column("options")
    for kind, cls in sorted(detector_kinds().items()):
        fields = cls.Options.model_fields
        opts = ", ".join(f"{n}{'' if f.is_required() else '?'}" for n, f in fields.items()) or "–"
        table.add_row(kind, cls.description, opts)
    console.print(table)
    console.print("Common fields: name, kind, threshold, rule (auto|score|argmax), batch_size, actors, num_cpus, num_gpus.")


@list_app.command("providers")
def list_providers() -> None:
    """Chat-model providers judges, LLM-based detectors and generators reach models through."""
    from redline.actors.providers import providers

    table = Table(title="chat-model providers (`provider:` of a judge, an LLM detector or a generator)")
    table.add_column("provider", style="bold")
    table.add_column("what it is")
    table.add_column("its own settings")
    for name, cls in providers().items():
        fields = cls.Options.model_fields
        opts = ", ".join(f"{n}{'' if f.is_required() else '?'}" for n, f in fields.items()) or "–"
        table.add_row(name, cls.description, opts)
    console.print(table)
    console.print("Common fields: provider, model, timeout_s, max_retries, backoff_s, concurrency, requests_per_second, "
                  "allow_insecure_http, max_retry_after_s, max_failed_in_row, max_answer_bytes.")


@list_app.command("categories")
def list_categories() -> None:
    """The DiaSafety taxonomy: unsafe categories of chatbot responses, with their definitions."""
    from redline.actors.dialogue_safety.taxonomy import CATEGORIES, UTTERANCE_LEVEL

    table = Table(title="dialogue-safety categories", show_lines=True)
    for col in ("category", "personal", "level", "in DiaSafety", "definition"):
        table.add_column(col, overflow="fold")
    for c in (*CATEGORIES, UTTERANCE_LEVEL):
        table.add_row(c.name, "personal" if c.personal else "non-personal", c.level, "yes" if c.in_dataset else "no",
                      c.definition)
    console.print(table)
    console.print("Add categories in a config with add_categories: [{name, definition, personal}].")


@list_app.command("recipes")
def list_recipes() -> None:
    """Attack recipes usable in `recipes:`: transformation, constraints, search, what they need offline."""
    from redline.actors.attack.recipes import recipe_table

    table = Table(title="attack recipes (every one runs with goal tae or bae)", show_lines=False)
    table.add_column("name", no_wrap=True, style="bold")
    columns = ("origin", "transformation", "pre", "post", "search", "needs")
    for col in columns:
        table.add_column(col, overflow="fold", min_width=20 if col == "needs" else None)
    rows = recipe_table()
    sources: dict[str, list[str]] = {}
    models: dict[str, list[str]] = {}
    for r in rows:
        table.add_row(r["name"], *(r[c] for c in columns))
        if r["source"] != "–":
            sources.setdefault(r["source"], []).append(r["name"])
        for note in r["models"].split("; ") if r["models"] != "–" else []:
            models.setdefault(note, []).append(r["name"])
    console.print(table)
    origins = Counter(r["origin"] for r in rows)
    console.print(f"{len(rows)} recipes: " + ", ".join(f"{n} {o}" for o, n in origins.items()), highlight=False)
    for source, names in sources.items():
        console.print(f"settings from {source}: {', '.join(names)}", soft_wrap=True, highlight=False)
    for note, names in models.items():
        console.print(f"{note}: {', '.join(names)}", soft_wrap=True, highlight=False)


@list_app.command("pipelines")
def list_pipelines() -> None:
    """Pipelines, their commands and example configs."""
    from redline.pipelines.registry import entries

    table = Table(title="pipelines")
    for col in ("pipeline", "command", "example", "what it does"):
        table.add_column(col, overflow="fold")
    for e in entries():
        table.add_row(e.name, "redline " + " ".join(e.command), f"examples/{e.example}", e.help)
    console.print(table)
