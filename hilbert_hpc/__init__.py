"""hilbert_hpc: Hilbert-ordered dilated attention over very long sequences, sharded across MPI ranks."""

from __future__ import annotations

__version__ = "0.1.0"

from hilbert_hpc.attention import dilated_attention
from hilbert_hpc.errors import ConfigError, JobFileError, UserError
from hilbert_hpc.core.ordering import ORDERINGS, inverse_order, serialization_order
from hilbert_hpc.core.patterns import Pattern, useful_flops

__all__ = [
    "__version__",
    "dilated_attention",
    "serialization_order",
    "inverse_order",
    "ORDERINGS",
    "Pattern",
    "useful_flops",
    "UserError",
    "ConfigError",
    "JobFileError",
]
