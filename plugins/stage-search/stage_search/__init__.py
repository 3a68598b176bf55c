"""STAGE sweeps: grids of models x plans x hardware, each point a content-addressed unit."""
