"""dpcore: the dpicl library (pure Python + torch; no Prefect, no MLflow).

Each module holds one idea; ARCHITECTURE.md (repository root) has the layer picture and the module map.
"""

__version__ = "0.1.0"
