"""Measuring with torch: operator efficiency curves, collective curves, step/memory/expert-load
profiles of a running model. torch is imported by the submodules, not here."""

__all__: list[str] = []
