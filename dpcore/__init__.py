"""dpcore: the dpicl library (pure Python + torch; no Prefect, no MLflow).

Each module holds one idea; the README's "Layout" section has the module map.
"""

__version__ = "0.1.0"
