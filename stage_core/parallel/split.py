"""Layers per pipeline chunk from the layers' weights: the heaviest chunk as light as possible,
then the load as even as possible.

The pp strategy's ``--stage-layers auto`` splits by each layer's training FLOPs
(stage-parallel's ``layer_weights``); ``stage search`` predicts the same split for the
plans it enumerates.  The embedding and the LM head with the loss each weigh one
layer of average weight on the first and the last chunk, as Megatron's
``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``
count them.
"""

from __future__ import annotations


def balanced_split(weights: list[int], chunks: int, first_extra: int | None = None,
                   last_extra: int | None = None) -> tuple[int, ...]:
    """Layers per chunk for layers of ``weights`` split in order into ``chunks`` parts.

    ``first_extra`` and ``last_extra`` weigh what the first and the last chunk run
    besides their layers (default: one layer of average weight each).  Exact
    integer arithmetic throughout.
    """
    n_layers = len(weights)
    if not 1 <= chunks <= n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {chunks} chunks")
    # scale by the layer count so that the average layer is a whole number
    scaled = [w * n_layers for w in weights]
    first = sum(weights) if first_extra is None else first_extra * n_layers
    last = sum(weights) if last_extra is None else last_extra * n_layers
    prefix = [0]
    for w in scaled:
        prefix.append(prefix[-1] + w)

    def weight(c: int, a: int, b: int) -> int:  # chunk c holding layers [a, b)
        return prefix[b] - prefix[a] + (first if c == 0 else 0) + (last if c == chunks - 1 else 0)

    def solve(score, combine, bound=None):
        """best[c][b]: the best score of chunks 0..c holding layers [0, b); with the split."""
        best = [{} for _ in range(chunks)]
        for b in range(1, n_layers - chunks + 2):
            w = weight(0, 0, b)
            if bound is None or w <= bound:
                best[0][b] = (score(w), None)
        for c in range(1, chunks):
            for b in range(c + 1, n_layers - (chunks - c) + 2):
                choice = None
                for a in range(c, b):
                    if a not in best[c - 1]:
                        continue
                    w = weight(c, a, b)
                    if bound is not None and w > bound:
                        continue
                    value = combine(best[c - 1][a][0], score(w))
                    if choice is None or value < choice[0]:
                        choice = (value, a)
                if choice is not None:
                    best[c][b] = choice
        return best

    heaviest = solve(lambda w: w, max)[chunks - 1][n_layers][0]
    best = solve(lambda w: w * w, lambda x, y: x + y, bound=heaviest)
    counts, b = [], n_layers
    for c in range(chunks - 1, -1, -1):
        a = best[c][b][1] or 0
        counts.append(b - a)
        b = a
    return tuple(reversed(counts))
