"""Search over legal parallel layouts with Optuna (ask/tell), plus an exhaustive vectorized baseline.
Never imports torch."""

__all__: list[str] = []
