"""Engine exports; the implementation lives in ``autoparallel.export``."""

from autoparallel.export import FORMATS, Export, export_plan, import_config, runnable_engines

__all__ = ["FORMATS", "Export", "export_plan", "import_config", "runnable_engines"]
