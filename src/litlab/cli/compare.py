"""Compare runs: report.md, report.csv and report.png from their summary.json files (docs/sweeps.md).
Runs that differ only in their seed are one row, with the mean and 95% confidence interval of each
figure and Welch's t-test against the baseline. Exits 1 after the report when a row did not complete,
2 on bad input (one "litlab: error:" line, no report).

    litlab-compare logs/train/multiruns/2026-12-01_10-00-00_1a2b3c      # rebuild a sweep's report
    litlab-compare SWEEP_A SWEEP_B RUN_DIR --out comparison/             # runs made at different times
    litlab-compare SWEEP --baseline "precision=bf16 trainer.accumulate_grad_batches=1" --metric val/loss:min
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from litlab.errors import EXIT_FAILED, EXIT_REFUSED, error_line
from litlab.report.collect import CompareError
from litlab.report.compare import DEFAULT_BASELINE
from litlab.report.render import report_runs


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``litlab-compare``."""
    parser = argparse.ArgumentParser(
        prog="litlab-compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", type=Path, help="sweep directories and/or run directories")
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"key=value pairs the baseline run has (default: '{DEFAULT_BASELINE}'); keys are config "
        "groups or dotted config keys; name trainer.devices to compare every device count with one run",
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="metric to report, NAME:min or NAME:max (lower or higher is better); the direction may be "
        "left out for the runs' optimized_metric and its val/ and test/ twins (default: optimized_metric)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the report (default: the one directory given)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = args.out or args.paths[0]
    try:
        if args.out is None and len(args.paths) > 1:
            raise CompareError("several directories given: name the output folder with --out")
        report = report_runs(args.paths, out, baseline=args.baseline, metric=args.metric)
    except CompareError as error:
        sys.stderr.write(error_line(error) + "\n")
        raise SystemExit(EXIT_REFUSED) from None
    if report.unfinished:  # as a sweep does: scripts notice
        parser.exit(EXIT_FAILED, f"litlab-compare: {report.unfinished_line(out / 'report.md')}\n")


if __name__ == "__main__":
    main()
