"""The functional key, declared once: what upstream's tuning database looks a kernel's row up by
besides the GPU (its LUT key; the seqlens by bin).

Everything that carries the key takes its fields from here: tune's grid entries
(codegen.gpu.tune.grid.GridEntry) and validate's cases (codegen.models.cases.Case) inherit it,
a measured winner (codegen.models.rows.Winner, a CSV row) keeps it flat through `row_fields`,
the bundle check's cases give theirs (codegen.ship.dispatch.DispatchCase.functional). The
database's `inputs$` columns it is spelled as are the format's knowledge
(codegen.formats.tuning_db.functional_inputs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, get_type_hints


@dataclass(frozen=True, order=True)
class Functional:
    """The key; a field added here is a field of each of the module doc's carriers."""

    dtype: str          # 'fp16'
    head_dim: int
    causal: bool
    dropout: bool
    bias: bool
    seqlen_q: int
    seqlen_k: int

    @classmethod
    def of(cls, carrier: Any) -> "Functional":
        """The key of anything that has its fields (a winner)."""
        return cls(**{k: getattr(carrier, k) for k in FIELDS})


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Functional))


def row_fields() -> dict[str, tuple[Any, Any]]:
    """The key's fields as pydantic's `create_model` takes them (name: (type, default)), for a row
    model that keeps them flat."""
    hints = get_type_hints(Functional)
    return {f.name: (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(Functional)}
