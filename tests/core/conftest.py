from stage_core.testing import stage_host  # noqa: F401  (pytest fixture)


def pytest_terminal_summary(terminalreporter, config):
    """The fuzz tests' counts per category (test_fuzz_*.py), after the run."""
    for line in config.__dict__.pop("fuzz_counts", []):  # (once, if both conftests load)
        terminalreporter.write_line(line)
