"""``zephon plan`` and ``zephon count``: write a plan bundle from a CONFIG file; run the count pass alone."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zephon.cli.output import CommandError, count_of, one_line_errors, warning_lines
from zephon.errors import PlanWarning, one_line

if TYPE_CHECKING:
    from zephon.plan.manifest import Manifest
    from zephon.recipe.work_source import WorkSource


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    metavar="PLAN_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write the plan bundle to (created; must be new or empty unless --overwrite).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing non-empty PLAN_DIR.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Count-pass processes (exact plans); with --engine ray, the CPUs of a local Ray instance.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Run the scan, partitioned sidecar joins and the count pass here, or as Ray tasks (RAY_ADDRESS, else a "
    "local Ray instance; docs/ray.md). The plan is the same.",
)
@click.option(
    "--materialize-selections",
    "materialize_selections",
    is_flag=True,
    help="Also copy the rows the plan reads from datasets with a selection into PLAN_DIR/selected/ (runs read "
    "them instead of the source: no row group decoded for a few rows; the plan is the same).",
)
@click.option(
    "--continue-from",
    "continue_from",
    metavar="PARENT_PLAN",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Continue the run of PARENT_PLAN: keep its first --at-step global steps, then follow CONFIG.",
)
@click.option("--at-step", "at_step", type=int, default=None, metavar="N", help="First global step of the new plan.")
@click.option(
    "--global-batch", "global_batch", type=int, default=None, metavar="G", help="The run's global batch (rows a step)."
)
@click.option(
    "--continue-from-state",
    "state_file",
    metavar="STATE.json",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The run's checkpoint state at the branch (all lanes; required for estimated plans).",
)
def plan(
    config: Path,
    output: Path,
    overwrite: bool,
    workers: int | None,
    engine: str,
    materialize_selections: bool,
    continue_from: Path | None,
    at_step: int | None,
    global_batch: int | None,
    state_file: Path | None,
) -> None:
    """Plan the work source in CONFIG and write the bundle to PLAN_DIR.

    CONFIG is a .yaml, .yml or .toml file (see docs/cli.md); relative dataset paths in it resolve against
    its directory. Prints a summary line and one line per dataset: its normalized weight, planned documents
    and passes (planned documents / rows), and in an exact plan made with user operators the planned documents
    they dropped. A plan that falls short of its budget or repeats a dataset heavily
    (plan.json `warnings`) adds one `zephon: warning: ...` line each on stderr; the exit status stays 0.

    With --continue-from PARENT_PLAN the new plan's first N global steps are PARENT_PLAN's, byte for byte, and
    the rest follows CONFIG (docs/training.md, continuing a run): exact plans need --at-step N and
    --global-batch G, estimated plans the run's state at the branch (--continue-from-state STATE.json).
    """
    from zephon.config_file import load_plan_config
    from zephon.plan.manifest import read_manifest

    with one_line_errors(), warning_lines():
        warnings.simplefilter("ignore", PlanWarning)  # printed below, after the summary, from plan.json
        loaded = load_plan_config(config)
        # Imported after the CONFIG is valid: the planner pulls in heavy modules, and errors should be quick.
        from zephon.planner.build import PlanOptions
        from zephon.planner.entry import plan_source

        if continue_from is None and (at_step is not None or global_batch is not None or state_file is not None):
            raise CommandError(
                "--at-step, --global-batch and --continue-from-state must come with --continue-from, got them "
                "without — add --continue-from PARENT_PLAN, or leave them out to plan from the start"
            )
        options = PlanOptions(
            tokenize=loaded.tokenize,
            pack=loaded.pack,
            sample_pack=loaded.sample_pack,
            overwrite=overwrite,
            workers=workers,
            engine=engine,
            progress=None,  # bars on a terminal only: zephon.storage.progress
            materialize_selections=materialize_selections,
        )
        plan_source(
            loaded.source,
            output,
            options,
            continue_from=continue_from,
            at_step=at_step,
            global_batch=global_batch,
            state=_read_state(state_file) if state_file is not None else None,
        )
        manifest = read_manifest(output)
    for line in plan_summary(manifest, str(output)):
        click.echo(line)
    for entry in manifest.warnings:
        click.echo(f"zephon: warning: {one_line(entry.message)}", err=True)


def _read_state(path: Path) -> dict[str, object]:
    """A checkpoint state saved as JSON (``json.dump(pipeline.state_dict(), f)``)."""
    import json

    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(
            f"{path} must be a JSON pipeline state, got {one_line(exc)} — save it with json.dump(pipeline.state_dict())"
        ) from exc
    if not isinstance(state, dict):
        raise CommandError(f"{path} must hold a JSON object (a pipeline state), got {type(state).__name__} — fix it")
    return state


def plan_summary(manifest: Manifest, plan_dir: str) -> list[str]:
    """The lines ``zephon plan`` prints for a bundle's manifest (names and numbers aligned in columns)."""
    datasets = manifest.datasets
    totals = manifest.totals
    lines = [
        f"planned {count_of(totals.documents, 'document')} from {count_of(len(datasets), 'dataset')} "
        f"({count_of(totals.shards, 'shard')}) → {plan_dir}  config {manifest.config_hash[:12]}"
    ]
    names = [d.name for d in datasets]
    docs = [str(d.planned_documents) for d in datasets]
    passes = [f"{d.planned_documents / d.documents:.2f}" for d in datasets]
    name_w, docs_w, pass_w = (max(map(len, col)) for col in (names, docs, passes))
    for d, name, n, p in zip(datasets, names, docs, passes, strict=True):
        line = f"  {name:<{name_w}}  weight {d.weight:.3f}  documents {n:>{docs_w}}  passes {p:>{pass_w}}"
        if d.planned_tokens is not None and totals.tokens_are == "cost":  # records: the samples' costs
            line += f"  cost {d.planned_tokens} (share {d.planned_token_share:.3f})"
        elif d.planned_tokens is not None:
            line += f"  tokens {d.planned_tokens} ({totals.tokens_are}, share {d.planned_token_share:.3f})"
        if d.dropped_by_operators is not None:  # exact plans with user operators: records they dropped
            line += f"  dropped by operators {d.dropped_by_operators}"
        lines.append(line)
    packed = manifest.sample_packing
    if packed is not None:
        over = packed.dropped_samples
        dropped = f", {count_of(over, 'sample')} over max_cost dropped" if over else ""
        lines.append(
            f"  rows {packed.rows} of max_cost {packed.max_cost} (best_fit), filled {packed.fill_fraction:.3f}{dropped}"
        )
    for phase in manifest.phases:
        weights = ", ".join(f"{name} {w:.3f}" for name, w in phase.weights.items())
        span = f"positions {phase.first_position}..{phase.end_position - 1}"
        if phase.end_position <= phase.first_position:
            span = "no documents (the plan ended before it)"
        segment = f" (segment {phase.segment})" if manifest.lineage is not None else ""
        lines.append(f"  phase {phase.index}{segment}: {span}, {count_of(phase.documents, 'document')}; {weights}")
    lineage = manifest.lineage
    if lineage is not None:
        b = lineage.branch
        lines.insert(
            1,
            f"  continues {lineage.parent.config_hash[:12]} ({lineage.parent.path}) from step {b.step} "
            f"(global batch {b.global_batch}), position {b.position}",
        )
        removed = manifest.config.get("continue_from", {}).get("removed", [])
        if removed:  # datasets the new config left out: read by the kept steps only
            lines.insert(2, f"  left out after the branch (read by the kept steps only): {', '.join(removed)}")
    lines.extend(selection_lines(manifest))
    return lines


def selection_lines(manifest: Manifest) -> list[str]:
    """What each selection kept and skipped, its sidecar's unmatched keys, and documents read by several
    datasets of one source (plan.json ``datasets[].selection`` and ``sources``)."""
    lines = []
    for d in manifest.datasets:
        s = d.selection
        if s is None:
            continue
        query = "; ".join(f"{k} {s[k]}" for k in ("where", "order_by", "dedup_on") if k in s)
        line = (
            f"  selection {d.name}: {s['selected']} of {s['rows']} rows ({query}); skipped: where "
            f"{s['skipped_by_where']}, dedup {s['skipped_by_dedup']}"
        )
        side = s.get("sidecar")
        if side is not None:
            line += (
                f"; sidecar {s['metadata']} on {s['key']}: {side['documents_without_metadata']} documents without "
                f"metadata, {side['metadata_without_document']} sidecar rows without a document"
            )
        lines.append(line)
    for src in manifest.sources or ():
        reads = src.reads_per_document
        lines.append(
            f"  source of {', '.join(src.datasets)}: {src.documents} documents, "
            f"{src.in_several_selections} in several selections; each read {reads.min}-{reads.max} times"
        )
    for name, c in (manifest.selected_copies or {}).items():
        lines.append(
            f"  copies of {name}: {c.rows} planned rows of {count_of(c.shards, 'shard')} in selected/, "
            f"{c.bytes / 2**20:.1f} MiB (the source shards: {c.source_bytes / 2**20:.1f} MiB); runs read these"
        )
    return lines


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: all cores).")
@click.option(
    "--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal)."
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Scan and count here, or as Ray tasks (RAY_ADDRESS, else a local Ray instance; docs/ray.md).",
)
def count(config: Path, workers: int | None, progress: bool | None, engine: str) -> None:
    """Tokenize every document of CONFIG's datasets once and cache exact token counts — or, for datasets of
    records with a computed cost (`cost: {function: "mypkg.costs:fn"}`), compute each sample's cost.

    Counts are cached per (shard fingerprint, field, tokenizer fingerprint) under $ZEPHON_CACHE_DIR, so exact
    plans (`exact_tokens: true`) and reruns reuse them; computed costs per (shard fingerprint, function and its
    source), so `zephon plan` reuses them. CONFIG needs a `tokenizer:` section or computed costs. Prints the
    shards counted (computed) now and found cached, and the tokens (costs) per dataset.
    """
    from zephon.config_file import load_plan_config
    from zephon.recipe.computed_cost import ComputedCost

    with one_line_errors(), warning_lines():
        loaded = load_plan_config(config)
        if any(isinstance(ds.cost, ComputedCost) for ds in loaded.source.datasets):
            _compute_costs(loaded.source, workers, progress, engine)
            return
        if loaded.tokenize is None:
            raise CommandError(
                f"{config}: `tokenizer` must be set to count tokens, got nothing — add `tokenizer: {{id: ...}}` (or "
                'give datasets of records a computed cost: `cost: {function: "mypkg.costs:fn"}`)'
            )
        from zephon.executor.encode.encoders import make_encoder
        from zephon.planner.counts.lengths import token_counts
        from zephon.planner.counts.stores import store_tokens
        from zephon.planner.prepare import shard_refs

        datasets = loaded.source.datasets
        groups = shard_refs(loaded.source, progress=progress, engine=engine, workers=workers)
        # Raw text is tokenized (and cached); a token store's counts are its index's, as plans take them.
        flat = [r for ds, g in zip(datasets, groups, strict=True) if ds.token_store is None for r in g]
        arrays, report = token_counts(
            flat,
            loaded.tokenize,
            make_encoder(loaded.tokenize),
            workers=workers,
            progress=progress,  # None: bars on a terminal only (zephon.storage.progress)
            engine=engine,
        )
    stored = [ds.token_store is not None for ds in datasets]
    it = iter(arrays)
    width = max(len(ds.name) for ds in datasets)
    limit = loaded.tokenize.max_tokens if loaded.tokenize.long_documents == "truncate" else None
    lines, total = [], 0
    for ds, group, is_store in zip(datasets, groups, stored, strict=True):
        counts = list(store_tokens(ds, group)) if is_store else [next(it) for _ in group]
        tokens = sum(int(c.sum()) for c in counts)
        total += tokens
        # The counts are after the cut: the documents at the limit were cut (or are exactly that long). A store's
        # ids are never cut.
        at = f"  at max_tokens {sum(int((c == limit).sum()) for c in counts)}" if limit and not is_store else ""
        kind = "  (token store: its index)" if is_store else ""
        lines.append(f"  {ds.name:<{width}}  documents {sum(r.rows for r in group)}  tokens {tokens}{at}{kind}")
    parts = sum(len(g) for g, s in zip(groups, stored, strict=True) if s)
    read = f", {count_of(parts, 'token store part')} read from their indexes" if parts else ""
    click.echo(f"counted {count_of(report.counted, 'shard')} ({report.cached} cached){read}: {total} tokens")
    for line in lines:
        click.echo(line)


def _compute_costs(source: WorkSource, workers: int | None, progress: bool | None, engine: str) -> None:
    """``zephon count`` over datasets with computed costs: the pass, then what it did and the costs per dataset
    (a dataset with an expression cost is scanned, not computed)."""
    from zephon.planner.counts.computed import source_costs
    from zephon.planner.prepare import shard_refs

    groups = shard_refs(source, progress=progress, engine=engine, workers=workers)
    arrays, report = source_costs(source.datasets, groups, workers=workers, progress=progress, engine=engine)
    click.echo(f"computed costs of {count_of(report.computed, 'shard')} ({report.cached} cached)")
    width = max(len(ds.name) for ds in source.datasets)
    for index, (ds, group) in enumerate(zip(source.datasets, groups, strict=True)):
        if index in arrays:
            total = sum(int(a.sum()) for a in arrays[index])
            click.echo(f"  {ds.name:<{width}}  samples {sum(r.rows for r in group)}  cost {total}")
