"""Datasets and task specs, neighbour-stable splits, the token cap on records, Parquet artifacts."""
