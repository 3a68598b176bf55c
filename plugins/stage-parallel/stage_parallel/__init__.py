"""STAGE's standard parallel strategies, declared as placements."""
