from stage_core.testing import stage_host  # noqa: F401  (pytest fixture)
