"""The model summary at the start of fitting, with real FLOPs or no FLOPs column.

Lightning prints a column of zero FLOPs for a module without ``example_input_array``, which reads as a
measurement; ``ModelSummaryWithMeasuredFlops`` drops it, and logs the table (so train.log has it too).
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import ModelSummary

from litlab.library_internals import format_summary_table

log = logging.getLogger("litlab")

_FLOPS_COLUMN = "FLOPs"
_FLOPS_TOTAL_LINE = "Total Flops"  # the last line of Lightning's table


class ModelSummaryWithMeasuredFlops(ModelSummary):
    """Lightning's ModelSummary (``trainer.enable_model_summary``), FLOPs shown only when counted:
    define ``example_input_array`` in your module to see them."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]], *totals: Any, total_flops: int, **kwargs: Any
    ) -> None:
        # totals: parameters, trainable parameters, model size and training modes, as Lightning passes them
        if not total_flops:
            summary_data = [column for column in summary_data if column[0] != _FLOPS_COLUMN]
        table = format_summary_table(*totals, total_flops, *summary_data)
        if not total_flops:
            table = "\n".join(line for line in table.splitlines() if not line.endswith(_FLOPS_TOTAL_LINE))
        log.info("model summary:\n%s", table)
