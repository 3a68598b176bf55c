"""Das et al. 2016 (arXiv 1602.06709): data-parallel strong scaling of synchronous SGD on CPU nodes.

VGG-A and OverFeat-FAST at a global minibatch of 256 and 512 images, over 1 to 128 dual-socket
Xeon E5-2697 v3 nodes (``--gpu das2016-fdr``, or ``--hardware das2016-aws``), fp32 weights,
activations and gradients, one rank per node, the minibatch split evenly (global / nodes
images per node, one micro-batch).  Each point is `stage estimate`'s replay of the rank
programs under ASTRA-sim's rules on the analytical network; the table gives the step,
images per second and the scaling factor against one node, and the paper's published
factors beside it (from its abstract; held out: nothing here is fitted to them).

Run: ``python benchmarks/bench_das2016.py [--hardware das2016-fdr] [--plot das2016.png]``; the
same points as a sweep grid: ``stage sweep`` over ``dp`` with ``global-batch`` and
``set = ["dtype=fp32"]`` (plugins/stage-model-vision/README.md).
"""

from __future__ import annotations

import argparse
import time

from stage_core import hardware
from stage_core.api import Plan, UsageError, plan_job
from stage_core.plugins import PluginHost
from stage_search.estimate import estimate_job

MODELS = ("vgg-a", "overfeat-fast")
BATCHES = (256, 512)
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
#: Das et al. 2016, abstract: (model, global minibatch, nodes) -> scaling factor (held out)
PUBLISHED = {("vgg-a", 512, 128): 90, ("vgg-a", 256, 64): 53, ("overfeat-fast", 256, 64): 42}
FP32 = {"dtype": "fp32"}


def point(host, hw, model: str, batch: int, nodes: int, hybrid: bool = False) -> dict:
    """One point: data parallel over the nodes; with ``hybrid`` Das et al.'s hybrid instead: the
    convolutions data parallel over every node, the fully connected layers model parallel
    (``--tp N --tp-convs data``)."""
    plan = Plan(dp=nodes, micro_batch_size=batch // nodes, micro_batches=1, grad_dtype="fp32")
    if hybrid:
        plan = Plan(tp=nodes, micro_batch_size=batch, grad_dtype="fp32").with_options(tp_convs="data")
    t0 = time.perf_counter()
    result = plan_job(host, model, FP32, plan, hw)
    step = estimate_job(result.job, hw).step_time_s
    return {"model": model, "batch": batch, "nodes": nodes, "step_s": step, "images_s": batch / step,
            "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="das2016-fdr")
    ap.add_argument("--nodes", default=",".join(map(str, NODES)))
    ap.add_argument("--plot", help="write the scaling factors as a PNG (needs matplotlib)")
    ap.add_argument("--hybrid", action="store_true", help="Das et al.'s hybrid: fully connected layers model "
                                                          "parallel over the nodes (--tp-convs data)")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    host = PluginHost()
    hw = hardware.resolve(host, args.hardware)
    nodes = [int(n) for n in args.nodes.split(",")]
    rows = []
    print(f"Das et al. 2016 on {args.hardware}: images/s and scaling vs one node (fp32, data parallel)")
    print(f"{'model':<14}{'batch':>6}{'nodes':>6}{'step ms':>11}{'images/s':>10}{'scaling':>9}{'paper':>7}")
    for model in args.models.split(","):
        for batch in BATCHES:
            base = None
            for n in nodes:
                if batch % n:
                    continue
                try:
                    row = point(host, hw, model, batch, n, args.hybrid)
                except UsageError as exc:
                    print(f"{model:<14}{batch:>6}{n:>6}  refused: {exc}")
                    continue
                base = base or row["images_s"]
                row["scaling"] = row["images_s"] / base
                paper = PUBLISHED.get((model, batch, n))
                rows.append(row)
                print(f"{model:<14}{batch:>6}{n:>6}{row['step_s'] * 1e3:>11.1f}{row['images_s']:>10.1f}"
                      f"{row['scaling']:>8.1f}x{(str(paper) + 'x') if paper else '':>7}", flush=True)
    if args.plot:
        try:
            import matplotlib
        except ImportError:
            print("--plot needs matplotlib (pip install matplotlib)")
            return 2

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4.5))
        for model in args.models.split(","):
            for batch in BATCHES:
                pts = [(r["nodes"], r["scaling"]) for r in rows if r["model"] == model and r["batch"] == batch]
                ax.plot(*zip(*pts), marker="o", label=f"{model}, minibatch {batch}")
        for (model, batch, n), factor in PUBLISHED.items():
            ax.scatter([n], [factor], marker="x", color="k")
        ax.plot(nodes, nodes, ls=":", color="grey", label="linear")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("nodes")
        ax.set_ylabel("scaling factor vs one node")
        ax.set_title(f"Das et al. 2016 on {args.hardware} (x: the paper's)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
