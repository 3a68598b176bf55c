"""Numbers as people read them: units, plain tables, and what a report prints.

Every size STAGE computes stays in bytes and every amount of compute in FLOPs (the
manifest, ``--json``); only what is printed for people is scaled here, one unit per
column, named in the header:

* memory in binary units (GiB = 2**30 bytes; MiB for small models), the unit a GPU's
  capacity is given in, so a rank's memory and its GPU's compare directly;
* traffic in decimal units (GB = 10**9 bytes), the unit link bandwidths are given in;
* compute in FLOP with SI prefixes (PFLOP = 10**15 FLOPs).

Traffic has two numbers per collective type: its *input* (the ``comm_size`` the trace
gives ASTRA-sim: an all-gather's shard, the whole buffer of the others) and its *wire*
bytes (what the ring algorithm sends on each rank's link: all-reduce 2(n-1)/n of the
buffer, reduce-scatter and all-to-all (n-1)/n of it, all-gather n-1 shards; see
:func:`stage_core.hardware.wire_bytes`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .rankset import ranks_text

GiB = 2**30
#: (name, bytes) of the binary units memory is shown in, largest first
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
_SI = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3), ("", 1))
#: the collective types in the order a report lists them, with their printed names
COLLECTIVES = (("all_reduce", "all-reduce"), ("all_gather", "all-gather"), ("reduce_scatter", "reduce-scatter"),
               ("all_to_all", "all-to-all"))
#: what the two numbers of a collective mean (printed under the traffic table)
TRAFFIC_NOTE = ("input: the collectives' comm_size as the trace gives it to ASTRA-sim (an all-gather's shard, the "
                "others' whole buffer); wire: the bytes the ring algorithm sends on the rank's link (all-reduce "
                "2(n-1)/n of its buffer, reduce-scatter and all-to-all (n-1)/n, all-gather n-1 shards; n: the "
                "group's ranks)")


# --------------------------------------------------------------------------- units


def binary_unit(most: float) -> tuple[str, int]:
    """The binary unit (name, bytes) a column whose largest value is ``most`` bytes is shown
    in: GiB from 1 GiB up (TiB from 1 TiB), MiB or KiB below."""
    for name, size in _BINARY:
        if most >= size or size == 1:
            return ("GiB", GiB) if name == "TiB" and most < 1024 * GiB else (name, size)
    return "B", 1


def si_unit(most: float, unit: str) -> tuple[str, int]:
    """The SI unit (``"PFLOP"``, ``"GB"``...) a column whose largest value is ``most`` is shown in."""
    for prefix, size in _SI:
        if abs(most) >= size:
            return prefix + unit, size
    return unit, 1


def gib(n: float) -> str:
    """Bytes as GiB with two decimals (``"101.12 GiB"``): memory beside a GPU's capacity."""
    return f"{n / GiB:,.2f} GiB"


def memory_text(n: float) -> str:
    """Bytes of memory in the binary unit that suits them (``"512 MiB"``, ``"7.45 GiB"``)."""
    name, size = binary_unit(n)
    return f"{_number(n / size)} {name}"


def si_text(n: float, unit: str) -> str:
    """``n`` with an SI prefix (``"4.82 PFLOP"``, ``"46.2 GB"``)."""
    name, size = si_unit(n, unit)
    return f"{_number(n / size)} {name}"


def _number(x: float) -> str:
    """Three significant digits, at least (no exponent; thousands separated)."""
    if x == 0:
        return "0"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def count_text(n: int) -> str:
    """A count of parameters: ``"405.85 B"``, ``"124.48 M"``."""
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.2f} M"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 rank class"``, ``"3 rank classes"``."""
    if n == 1:
        return f"1 {word}"
    return f"{n:,} {many or (word + 'es' if word.endswith(('s', 'sh', 'ch', 'x')) else word + 's')}"


# --------------------------------------------------------------------------- rank lists


def ranks_range(ranks: Sequence[int] | str, most: int = 4) -> str:
    """Ranks as ranges (``"0-511"``); a list of more than ``most`` ranges is cut to its
    first two and its last one, with how many blocks of how many ranks it holds when they
    repeat evenly (``"0-7,128-135,...,8064-8071 (64x8)"``), else how many ranks.  ``ranks``
    may be given as :func:`~stage_core.rankset.ranks_text` gives them."""
    text = ranks if isinstance(ranks, str) else ranks_text(ranks)
    parts = text.split(",")
    if len(parts) <= most:
        return text
    spans = [tuple(int(x) for x in p.split("-")) if "-" in p else (int(p), int(p)) for p in parts]
    sizes = {b - a + 1 for a, b in spans}
    steps = {spans[i + 1][0] - spans[i][0] for i in range(len(spans) - 1)}
    shown = f"{','.join(parts[:2])},...,{parts[-1]}"
    if len(sizes) == 1 and len(steps) == 1:
        size = sizes.pop()
        return f"{shown} ({len(spans)} ranks)" if size == 1 else f"{shown} ({len(spans)}x{size})"
    return f"{shown} ({sum(b - a + 1 for a, b in spans):,} ranks)"


# --------------------------------------------------------------------------- tables


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int | Iterable[int] = 2,
          indent: str = "") -> list[str]:
    """A plain text table: the first ``left`` columns (or the columns of those indices)
    aligned left, the others right."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lefts = set(range(left)) if isinstance(left, int) else set(left)

    def line(values: Sequence[str]) -> str:
        out = [v.ljust(w) if i in lefts else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return (indent + "  ".join(out)).rstrip()

    return [line(list(headers)), *(line(r) for r in cells)]


# --------------------------------------------------------------------------- memory beside the GPU


def fit_text(used: int, gpu) -> str:
    """``"101.12 GiB of the h100's 80 GiB (126%): does NOT fit"``; "" without a capacity."""
    capacity = getattr(getattr(gpu, "gpu", None), "memory_gib", 0) or 0
    if not capacity:
        return ""
    share = used / (capacity * GiB)
    verdict = "fits" if share <= 1 else "does NOT fit"
    return f"{gib(used)} of the {gpu.gpu.name}'s {capacity:g} GiB ({100 * share:.0f}%): {verdict}"


def memory_fit(classes: Sequence[Mapping], gpu) -> dict | None:
    """The largest memory of a rank beside ``gpu``'s capacity, as JSON: None without one."""
    capacity = getattr(getattr(gpu, "gpu", None), "memory_gib", 0) or 0
    if not capacity or not classes:
        return None
    peak = max(rc["memory_bytes"]["total"] for rc in classes)
    busiest = sorted(r for rc in classes if rc["memory_bytes"]["total"] == peak for r in rc["ranks"])
    return {"gpu": gpu.gpu.name, "capacity_bytes": int(capacity * GiB), "peak_bytes": peak,
            "peak_ranks": ranks_text(busiest), "share": peak / (capacity * GiB), "fits": peak <= capacity * GiB}


def fit_line(classes: Sequence[Mapping], gpu, label: str = "") -> str:
    """``"memory: up to 107.10 GiB per GPU (stages 1-12) of the h100's 80 GiB (134%): does NOT fit"``
    (``label``: what the classes are, in order; else their ranks are named); "" without a
    GPU capacity."""
    fit = memory_fit(classes, gpu)
    if fit is None:
        return ""
    peak = fit["peak_bytes"]
    if len(classes) == 1:
        where = ""
    elif label:
        which = [i for i, rc in enumerate(classes) if rc["memory_bytes"]["total"] == peak]
        where = f" ({label}{'s' if len(which) > 1 else ''} {ranks_text(which)})"
    else:
        where = f" (ranks {ranks_range([r for rc in classes if rc['memory_bytes']['total'] == peak for r in rc['ranks']])})"
    verdict = "fits" if fit["fits"] else "does NOT fit"
    return (f"memory: up to {gib(fit['peak_bytes'])} per GPU{where} of the {fit['gpu']}'s "
            f"{fit['capacity_bytes'] / GiB:g} GiB ({100 * fit['share']:.0f}%): {verdict}")


# --------------------------------------------------------------------------- a report's tables


def class_rows(m: Mapping) -> list[tuple[str, Mapping]]:
    """(label, rank class) of a manifest's classes: a training plan's are its pipeline
    stages, in order; otherwise they are numbered."""
    classes = m["rank_classes"]
    plan = m.get("plan", {})
    staged = plan.get("pp", 1) > 1 and len(classes) == plan.get("pp") and plan.get("task") != "serve"
    return [(str(i), rc) for i, rc in enumerate(classes)] if staged or len(classes) > 1 else [("", rc) for rc in classes]


def stage_layers(m: Mapping) -> list[str] | None:
    """Layers per pipeline stage, when each stage runs one chunk."""
    plan = m.get("plan", {})
    layers = plan.get("stage_layers") or []
    if plan.get("pp", 1) > 1 and len(layers) == plan["pp"] and len(m["rank_classes"]) == plan["pp"]:
        return [str(n) for n in layers]
    return None


def compute_memory_table(m: Mapping, gpu=None, label: str = "stage") -> list[str]:
    """One row per rank class: its FLOPs, its memory by kind and in all (beside the GPU's
    capacity when one is known), its compute time when the set is timed."""
    rows = class_rows(m)
    classes = [rc for _, rc in rows]
    flops_unit, flops_size = si_unit(max(rc["flops"]["total"] for rc in classes), "FLOP")
    kinds = [k for k in classes[0]["memory_bytes"] if k != "total"
             and any(rc["memory_bytes"].get(k) for rc in classes)]
    mem_unit, mem_size = binary_unit(max(rc["memory_bytes"]["total"] for rc in classes))
    layers = stage_layers(m)
    capacity = getattr(getattr(gpu, "gpu", None), "memory_gib", 0) or 0
    timed = all("compute_time_us" in rc for rc in classes)
    headers = [label if rows[0][0] else "", "ranks"] + (["layers"] if layers else [])
    headers += [f"matmul {flops_unit}", f"total {flops_unit}"]
    headers += [f"{_MEMORY_NAMES.get(k, k)} {mem_unit}" for k in kinds] + [f"memory {mem_unit}"]
    if capacity:
        headers.append(f"of {gpu.gpu.name}'s {capacity:g} GiB")
    if timed:
        headers.append("compute ms")
    out = []
    for i, (name, rc) in enumerate(rows):
        mem = rc["memory_bytes"]
        row = [name, ranks_range(rc["ranks"])] + ([layers[i]] if layers else [])
        row += [_fixed(rc["flops"]["matmul"] / flops_size), _fixed(rc["flops"]["total"] / flops_size)]
        row += [_fixed(mem.get(k, 0) / mem_size) for k in kinds] + [_fixed(mem["total"] / mem_size)]
        if capacity:
            share = mem["total"] / (capacity * GiB)
            row.append(f"{100 * share:.0f}%" + ("" if share <= 1 else " NOT fit"))
        if timed:
            row.append(f"{rc['compute_time_us'] / 1e3:,.3f}")
        out.append(row)
    if not rows[0][0]:
        headers = headers[1:]
        out = [r[1:] for r in out]
    return table(headers, out, left=1 if not rows[0][0] else 2)


_MEMORY_NAMES = {"parameters": "params", "gradients": "grads", "optimizer": "optimizer",
                 "activations": "activations", "kv_cache": "KV cache"}


def traffic_table(m: Mapping, label: str = "stage") -> list[str]:
    """One row per rank class: per collective type its input and wire bytes, then sends,
    receives and the wire bytes in all (the note under it says which is which)."""
    rows = class_rows(m)
    classes = [rc for _, rc in rows]
    kinds = [(k, name) for k, name in COLLECTIVES if any(rc["comm_bytes"].get(k) for rc in classes)]
    p2p = [k for k in ("send", "recv") if any(rc["comm_bytes"].get(k) for rc in classes)]
    if not kinds and not p2p:
        return []
    wire = [rc.get("wire_bytes") or {} for rc in classes]
    totals = [sum(w.values()) if w else None for w in wire]
    most = max([rc["comm_bytes"][k] for rc in classes for k, _ in kinds + [(k, k) for k in p2p]]
               + [w.get(k, 0) for w in wire for k in w] + [1])
    unit, size = si_unit(most, "B")
    headers = [label if rows[0][0] else "", "ranks"]
    for _, name in kinds:
        headers += [f"{name} input", "wire"]
    headers += [{"send": "sent", "recv": "received"}[k] for k in p2p]
    has_wire = all(t is not None for t in totals)
    if has_wire:
        headers.append("wire sent")
    out = []
    for (name, rc), w, total in zip(rows, wire, totals):
        row = [name, ranks_range(rc["ranks"])]
        for k, _ in kinds:
            row += [_fixed(rc["comm_bytes"][k] / size), _fixed(w[k] / size) if k in w else "-"]
        row += [_fixed(rc["comm_bytes"][k] / size) for k in p2p]
        if has_wire:
            row.append(_fixed((total - w.get("recv", 0)) / size))
        out.append(row)
    if not rows[0][0]:
        headers = headers[1:]
        out = [r[1:] for r in out]
    lines = table(headers, out, left=1 if not rows[0][0] else 2)
    return [f"traffic per rank ({unit})", *lines]


def _fixed(x: float) -> str:
    """A table cell: two decimals below 100, one below 1,000, none above (thousands separated);
    ``<0.01`` for a small amount that is not none."""
    if x == 0:
        return "0"
    if abs(x) < 0.005:
        return "<0.01"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}"
