"""STAGE's built-in hardware: A100 and H100 presets, the roofline and calibrated compute models."""

__version__ = "0.1.0"
