"""Das et al. 2016 (arXiv 1602.06709): strong scaling of synchronous SGD on CPU nodes, as a table and a plot.

VGG-A and OverFeat-FAST at a global minibatch of 256 and 512 images over 1 to 128 nodes, and the
7-layer speech DNN (``das2016-dnn``, stage-model-mlp) at a minibatch of 1024 frames over 1 to 16
nodes, on dual-socket Xeon E5-2697 v3 nodes on FDR InfiniBand (``--hardware das2016-fdr``; the
paper's Ethernet cluster is ``das2016-aws``); fp32 weights, activations and gradients, one rank a
node.  Each point is ``stage estimate``'s replay of the rank programs under ASTRA-sim's rules on the
analytical network, two ways:

* data parallel: the minibatch split evenly, ``global / nodes`` examples a node, one micro-batch;
* hybrid (Das et al.'s): the convolutions data parallel over every node, the fully connected layers
  model parallel within groups of G nodes and data parallel across the groups (``--tp G --dp N/G
  --tp-convs data``; for the DNN, which is all fully connected, ``--tp G --dp N/G``); the best G.

The table gives the step, examples (images or frames) per second and the scaling factor against one
node; the paper's published factors sit beside them (from its abstract; held out: nothing here is
fitted to them).  The compute model's single-node throughput is printed first (``--hardware``'s
``matmul_efficiency``; the paper's single-node figures were not found, see
plugins/stage-hardware/stage_hardware/das2016.py).

Run: ``python benchmarks/bench_das2016.py [--hardware das2016-fdr] [--plot das2016.png] [--markdown]``
(the plot needs matplotlib: ``pip install 'stage-search[plot]'``).  The same data-parallel points as
a sweep grid: ``stage sweep benchmarks/das2016.toml -o das2016.csv``.

On das2016-fdr (the committed parameters; 37 rows in 3 s), one node trains VGG-A at 32.8 images/s,
OverFeat-FAST at 94.3 and the DNN at 5,442 frames/s (64.0%, 67.2%, 63.0% of peak), and where the
paper gives a factor (the whole table: plugins/stage-model-vision/README.md):

| model | minibatch | nodes | dp scaling | hybrid G | hybrid images/s | hybrid scaling | paper |
|---|---|---|---|---|---|---|---|
| vgg-a | 512 | 128 | 53.4x | 8 | 2903.8 | 88.4x | 90x |
| vgg-a | 256 | 64 | 28.0x | 2 | 1473.2 | 45.0x | 53x |
| overfeat-fast | 256 | 64 | 9.9x | 8 | 2244.0 | 23.8x | 42x |
| das2016-dnn | 1024 frames | 16 | 2.2x | 8 | 31951.5 frames/s | 5.9x | 6.5x |
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stage_core.api import (PluginHost, Plan, UsageError, check_output_file, divisors, hardware, plan_job,
                            write_figure)
from stage_search.estimate import estimate_job

#: (model, global minibatches, node counts, what one example is)
STUDY = (
    ("vgg-a", (256, 512), (1, 2, 4, 8, 16, 32, 64, 128), "images"),
    ("overfeat-fast", (256, 512), (1, 2, 4, 8, 16, 32, 64, 128), "images"),
    # the minibatch of Seide et al. 2014's Switchboard DNN (the paper's DNN comes from that line of work)
    ("das2016-dnn", (1024,), (1, 2, 4, 8, 16), "frames"),
)
#: Das et al. 2016, abstract: (model, global minibatch or None where the abstract gives none, nodes) ->
#: scaling factor (held out).  It also gives "~14X on 16 nodes" on the AWS cluster, for a network it
#: does not name there.
PUBLISHED = {("vgg-a", 512, 128): 90, ("vgg-a", 256, 64): 53, ("overfeat-fast", 256, 64): 42,
             ("das2016-dnn", None, 16): 6.5}
FP32 = {"dtype": "fp32"}
CONVOLUTIONAL = ("vgg-a", "overfeat-fast")


#: the cluster the published factors were measured on
PUBLISHED_ON = "das2016-fdr"


def published(model: str, batch: int, nodes: int):
    return PUBLISHED.get((model, batch, nodes), PUBLISHED.get((model, None, nodes)))


def plan_for(model: str, batch: int, nodes: int, group: int = 1) -> Plan:
    """Data parallel over ``nodes`` (``group`` 1), or the hybrid with fully connected layers model
    parallel over groups of ``group`` nodes."""
    plan = Plan(tp=group, dp=nodes // group, micro_batch_size=batch // (nodes // group), micro_batches=1,
                grad_dtype="fp32")
    return plan.with_options(tp_convs="data") if group > 1 and model in CONVOLUTIONAL else plan


def step_s(host, hw, model: str, plan: Plan) -> float:
    return estimate_job(plan_job(host, model, FP32, plan, hw).job, hw).step_time_s


def point(host, hw, model: str, batch: int, nodes: int, hybrid: bool = True) -> dict:
    """One row: the data-parallel step and, with ``hybrid``, the best hybrid group size's."""
    row = {"model": model, "batch": batch, "nodes": nodes, "dp_s": step_s(host, hw, model, plan_for(model, batch, nodes))}
    row["hybrid_g"], row["hybrid_s"] = 1, row["dp_s"]
    for group in (divisors(nodes)[1:] if hybrid else ()):
        try:
            s = step_s(host, hw, model, plan_for(model, batch, nodes, group))
        except UsageError:  # a group size the model cannot split over (the 1000 classes by 16)
            continue
        if s < row["hybrid_s"]:
            row["hybrid_g"], row["hybrid_s"] = group, s
    return row


def single_node(host, hw, model: str, batch: int) -> dict:
    """One node's step, its examples per second and the FLOP rate it implies."""
    result = plan_job(host, model, FP32, plan_for(model, batch, 1), hw)
    step = estimate_job(result.job, hw).step_time_s
    flops = result.manifest["rank_classes"][0]["flops"]["total"]
    return {"step_s": step, "rate": batch / step, "tflops": flops / step / 1e12,
            "peak": flops / step / 1e12 / hw.gpu.matmul_tflops["fp32"]}


def plot(rows: list[dict], path: str, title: str, paper: bool, force: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for model, batches, _nodes, unit in STUDY:
        for batch in batches:
            pts = [r for r in rows if r["model"] == model and r["batch"] == batch]
            if not pts:
                continue
            color = next(colors)
            nodes = [r["nodes"] for r in pts]
            label = f"{model}, {batch} {unit}"
            left.plot(nodes, [batch / r["dp_s"] for r in pts], "o-", color=color, label=f"{label}, dp")
            left.plot(nodes, [batch / r["hybrid_s"] for r in pts], "s--", color=color, label=f"{label}, hybrid")
            right.plot(nodes, [pts[0]["dp_s"] / r["dp_s"] for r in pts], "o-", color=color)
            right.plot(nodes, [pts[0]["dp_s"] / r["hybrid_s"] for r in pts], "s--", color=color)
            for (m, b, n), factor in PUBLISHED.items() if paper else ():
                if m == model and (b in (batch, None)):
                    right.scatter([n], [factor], marker="x", s=60, color=color, zorder=3)
    top = max(r["nodes"] for r in rows)
    right.plot([1, top], [1, top], ls=":", color="grey", label="linear")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("nodes")
    left.set_ylabel("examples per second (images or frames)")
    right.set_ylabel("scaling factor vs one node")
    right.set_title("x: the paper's factors (held out)" if paper else "", fontsize=9)
    left.set_title(title, fontsize=9)
    left.legend(fontsize=6)
    right.legend(fontsize=7)
    fig.tight_layout()
    write_figure(path, fig, "--plot", force=force)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="das2016-fdr")
    ap.add_argument("--models", default=",".join(m for m, *_ in STUDY))
    ap.add_argument("--max-nodes", type=int, default=128, help="leave out larger node counts")
    ap.add_argument("--no-hybrid", action="store_true", help="data parallel only (faster)")
    ap.add_argument("--plot", help="write the throughputs and scaling factors as a PNG (needs matplotlib)")
    ap.add_argument("--force", action="store_true", help="replace a --plot file STAGE did not write")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2


def run(args) -> int:
    known = [m for m, *_ in STUDY]
    unknown = [m for m in args.models.split(",") if m not in known]
    if unknown:
        raise UsageError(f"--models {args.models}: {', '.join(unknown)} not in the study; valid: {', '.join(known)}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib, an optional extra: pip install 'stage-search[plot]'") from None
        check_output_file(args.plot, "--plot", force=args.force)
    host = PluginHost()
    hw = hardware.resolve(host, args.hardware, "--hardware")
    study = [s for s in STUDY if s[0] in args.models.split(",")]
    print(f"Das et al. 2016 on {args.hardware}: one node, fp32 (compute model {hw.gpu.compute_model}, "
          f"matmul_efficiency {hw.gpu.parameters.get('matmul_efficiency')})")
    print(f"{'model':<14}{'minibatch':>10}{'step ms':>11}{'per s':>9}{'TFLOP/s':>9}{'of peak':>9}")
    for model, batches, _nodes, unit in study:
        for batch in batches:
            one = single_node(host, hw, model, batch)
            print(f"{model:<14}{batch:>10}{one['step_s'] * 1e3:>11.1f}{one['rate']:>9.1f}{one['tflops']:>9.3f}"
                  f"{one['peak']:>8.1%}  ({unit})")
    print()
    if args.markdown:
        print("| model | minibatch | nodes | dp step ms | dp per s | dp scaling | hybrid G | hybrid step ms | "
              "hybrid per s | hybrid scaling | paper |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'model':<14}{'batch':>6}{'nodes':>6} |{'dp ms':>9}{'per s':>9}{'scale':>7} |{'G':>4}{'hyb ms':>9}"
              f"{'per s':>9}{'scale':>7} |{'paper':>6}")
    rows = []
    t0 = time.perf_counter()
    for model, batches, nodes, _unit in study:
        for batch in batches:
            base = None
            for n in (n for n in nodes if n <= args.max_nodes and batch % n == 0):
                row = point(host, hw, model, batch, n, hybrid=not args.no_hybrid)
                base = base or row["dp_s"]
                rows.append(row)
                paper = published(model, batch, n) if args.hardware == PUBLISHED_ON else None
                paper = f"{paper:g}x" if paper else ""
                cells = (row["dp_s"] * 1e3, batch / row["dp_s"], base / row["dp_s"], row["hybrid_g"],
                         row["hybrid_s"] * 1e3, batch / row["hybrid_s"], base / row["hybrid_s"])
                if args.markdown:
                    print(f"| {model} | {batch} | {n} | {cells[0]:.1f} | {cells[1]:.1f} | {cells[2]:.1f}x | {cells[3]} | "
                          f"{cells[4]:.1f} | {cells[5]:.1f} | {cells[6]:.1f}x | {paper} |", flush=True)
                else:
                    print(f"{model:<14}{batch:>6}{n:>6} |{cells[0]:>9.1f}{cells[1]:>9.1f}{cells[2]:>6.1f}x |"
                          f"{cells[3]:>4}{cells[4]:>9.1f}{cells[5]:>9.1f}{cells[6]:>6.1f}x |{paper:>6}", flush=True)
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    if args.plot:
        plot(rows, args.plot, f"Das et al. 2016 on {args.hardware}: dp (solid), hybrid (dashed)",
             args.hardware == PUBLISHED_ON, args.force)
        print(f"plot: {Path(args.plot).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
