"""``python -m autoparallel.schema``: regenerate the shipped JSON Schema file."""

from autoparallel.schema import write_schema

print(write_schema())  # noqa: T201 - a developer script, not library code
