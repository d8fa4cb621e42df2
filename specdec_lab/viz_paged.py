from .viz import fragmentation_figure  # noqa: F401  (moved to viz.py; kept for old imports)
