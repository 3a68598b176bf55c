"""STAGE graph datasets: rank programs as LayerDAG-style graphs, and DAGs back to trace sets."""
