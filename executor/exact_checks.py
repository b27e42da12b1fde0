"""Whether an exact plan may run with a run's settings: an exact plan fixes every document's token count, its
operators and its packing, so a run with another tokenizer, field, operators, packing or skip policy would cut
other rows than the plan's — refused before anything is read, in one line naming each difference."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon.errors import ConfigError
from zephon.executor.encode.text import Encoder
from zephon.executor.operators import describe as describe_operators
from zephon.executor.operators import names as operator_names
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.settings import ExecutorSpec
from zephon.plan.manifest_parts import STORES_ONLY

if TYPE_CHECKING:
    from zephon.executor.encode.encoders import ChatEncoder, TextEncoder


def check_exact_plan(plan: PlanBundle, spec: ExecutorSpec, encoder: Encoder | TextEncoder | ChatEncoder) -> None:
    """Refuse to run an exact plan with a tokenizer or packing other than the ones it was planned with."""
    if spec.on_bad_document != "raise":
        raise ConfigError(
            f'on_bad_document must be "raise" for an exact plan, got {spec.on_bad_document!r} — its token counts, '
            "offsets and packing include every document, so none can be skipped: fix or remove the bad documents "
            "and re-plan, or plan without exact_tokens to skip them"
        )
    planned_ops = plan.manifest.config.get("operators")
    ops = describe_operators(spec.operators) or None
    if planned_ops != ops:
        raise ConfigError(
            f"an exact plan must run with the operators it was counted with, got {operator_names(ops)} (planned "
            f"with {operator_names(planned_ops)}) — add the same map_transform/map_batch calls (same source and "
            "version), or re-plan"
        )
    tok = plan.manifest.tokenizer
    assert tok is not None  # read_manifest requires it of exact plans
    packing = plan.manifest.exact_packing()
    differences = []
    # A plan of token stores only never tokenized (fingerprint STORES_ONLY): the run's tokenizer is checked against
    # each store's recorded identity instead (zephon.executor.token_stores.identity) and every id against its vocab.
    if tok.fingerprint != encoder.fingerprint and tok.fingerprint != STORES_ONLY:
        differences.append(f"tokenizer {spec.tokenize.tokenizer_id!r} (planned with {tok.id!r}; fingerprints differ)")
    if tok.field != spec.tokenize.field:
        differences.append(f"field {spec.tokenize.field!r} (planned {tok.field!r})")
    if packing.max_length != spec.pack.max_length:
        differences.append(f"max_length {spec.pack.max_length} (planned {packing.max_length})")
    if packing.algorithm != spec.pack.algorithm:
        differences.append(f"algorithm {spec.pack.algorithm!r} (planned {packing.algorithm!r})")
    if differences:
        raise ConfigError(
            f"an exact plan must run with the settings it was planned with, got {'; '.join(differences)} — "
            "use the planned settings or re-plan"
        )
