"""Serving metrics of an inference set, from the simulated finish times.

A step of an inference set serves a batch of requests; the simulator says when each
rank finishes it.  Per side (what the manifest's plan says the ranks run):

* prefill: every request of the batch (micro-batch size x micro-batches x dp) has its
  prompt (``seq_len`` tokens) run and its first token produced by the end of the step:
  the *time to first token* (TTFT) is the side's step, the last request's (with
  disaggregated serving, its KV cache sent to the decode side too); *prompt tokens/s*
  the batch's prompt tokens over it;
* decode: each of ``decode_steps`` steps gives every request one token: the *time per
  output token* (TPOT) is the side's time over its steps, *output tokens/s* the batch's
  tokens over the same time.  In a disaggregated set (``--task serve``) the decode ranks
  wait for the prefill side's KV caches, which arrive as the prefill ranks finish: the
  decode side's time is its finish less the prefill side's.

Times are the slowest rank's of each side (its finish time, ns in ``results.json``);
a side with a rank that never finished has none.
"""

from __future__ import annotations

from typing import Any, Mapping

from .parser import RankResult

NOTE = ("TTFT: the prefill side's step (every prompt of its batch run, its first token out and, serving, its KV "
        "cache sent); TPOT: the decode side's time per decode step (serving: after the last KV cache arrived, "
        "the prefill side's finish); tokens/s: the side's batch of prompt or output tokens over that time")


def _requests(plan: Mapping[str, Any]) -> int:
    return int(plan.get("micro_batch_size", 1)) * int(plan.get("micro_batches", 1)) * int(plan.get("dp", 1))


def _finish(ranks: Mapping[int, RankResult], members) -> int | None:
    times = []
    for r in members:
        got = ranks.get(r)
        if got is None or not got.finished:
            return None
        times.append(got.finish_time_ns)
    return max(times, default=None)


def serving_results(manifest: Mapping[str, Any], ranks: Mapping[int, RankResult]) -> dict | None:
    """``{"prefill": {...}, "decode": {...}, "note"}`` for an inference set (None for training):
    each side's requests, tokens, ``ttft_s`` or ``tpot_s`` and ``tokens_per_s``."""
    plan = manifest.get("plan") or {}
    task = plan.get("task", "train")
    if task not in ("prefill", "decode", "serve"):
        return None
    classes = manifest.get("rank_classes") or []
    if task == "serve":
        sides = {side: [r for rc in classes if rc.get("side") == side for r in rc["ranks"]]
                 for side in ("prefill", "decode")}
        plans = {side: plan.get(side) or {} for side in sides}
    else:
        sides = {task: [r for rc in classes for r in rc["ranks"]]}
        plans = {task: plan}
    out: dict[str, Any] = {}
    prefill_ns = None
    if "prefill" in sides:
        p = plans["prefill"]
        prefill_ns = _finish(ranks, sides["prefill"])
        requests, tokens = _requests(p), _requests(p) * int(p.get("seq_len") or 0)
        out["prefill"] = {"requests": requests, "prompt_tokens": tokens,
                          "ttft_s": None if prefill_ns is None else prefill_ns * 1e-9,
                          "tokens_per_s": tokens / (prefill_ns * 1e-9) if prefill_ns else None}
    if "decode" in sides:
        d = plans["decode"]
        finish = _finish(ranks, sides["decode"])
        span = None
        if finish is not None:
            span = finish - (prefill_ns or 0) if task == "serve" else finish
            if task == "serve" and prefill_ns is None:
                span = None
        steps = int(d.get("decode_steps") or 1)
        requests = _requests(d)
        out["decode"] = {"requests": requests, "decode_steps": steps, "output_tokens": requests * steps,
                         "tpot_s": None if not span else span * 1e-9 / steps,
                         "tokens_per_s": requests * steps / (span * 1e-9) if span else None}
    out["note"] = NOTE
    return out


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.3f} ms"


def _rate(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_serving(serving: Mapping[str, Any]) -> str:
    """The serving lines under the step table."""
    lines = []
    if "prefill" in serving:
        p = serving["prefill"]
        lines.append(f"prefill: time to first token {_ms(p['ttft_s'])}; {_rate(p['tokens_per_s'])} prompt tokens/s "
                     f"({p['requests']:,} requests, {p['prompt_tokens']:,} prompt tokens)")
    if "decode" in serving:
        d = serving["decode"]
        lines.append(f"decode: time per output token {_ms(d['tpot_s'])}; {_rate(d['tokens_per_s'])} output tokens/s "
                     f"({d['requests']:,} requests x {d['decode_steps']:,} step{'s' if d['decode_steps'] != 1 else ''})")
    lines.append(f"({serving['note']})")
    return "\n".join(lines)
