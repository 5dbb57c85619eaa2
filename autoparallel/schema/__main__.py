"""``python -m autoparallel.schema``: regenerate the shipped JSON Schema file of the plan
(version 2); ``--stdout`` prints the schema instead of writing the file."""

import sys

from autoparallel.schema import schema_text, write_schema

if "--stdout" in sys.argv[1:]:
    sys.stdout.write(schema_text())
else:
    sys.stdout.write(f"{write_schema()}\n")
