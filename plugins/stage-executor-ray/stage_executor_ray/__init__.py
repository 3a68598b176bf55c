"""The ``ray`` executor for STAGE sweeps."""
