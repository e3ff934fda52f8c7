"""dpcore: the dpicl library (pure Python + torch; no Prefect, no MLflow).

Each module holds one idea; see DESIGN.md for the map.
"""

__version__ = "0.1.0"
