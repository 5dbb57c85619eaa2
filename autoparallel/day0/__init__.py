"""Day-0 bring-up of a new model on a cluster: operator coverage of a device backend, then one
command that chains describe, coverage, probe or preset, plans, exports, staged checks and the
long-context sweep into one report folder.

Importing this package does not import torch; ``operator_coverage`` does on first call.
"""

from autoparallel.day0._coverage import CoverageReport, OperatorCoverage, operator_coverage

__all__ = ["CoverageReport", "OperatorCoverage", "operator_coverage"]
