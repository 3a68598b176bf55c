"""Open a directory of per-rank trace files as a :class:`~stage_core.trace.TraceSet`.

Files are ``<prefix>.<rank>.<suffix>`` (STAGE writes the prefix ``trace``;
other generators use their own, e.g. ``all_reduce``).  A directory must hold one
prefix (or ``trace`` among several) and ranks 0..N-1 with none missing; the world
size is N.  ``comm_groups.json`` beside them, when present, gives the groups.
A set whose ``manifest.json`` names a ``"subset"`` of its ranks (``stage generate
--ranks``) holds exactly those ranks' files, of the manifest's world size.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from stage_core.api import TraceNode, TraceSet, UsageError, parse_ranks, read_input

from .errors import ChakraReadError
from .schema import ET_VERSION, GENERATOR_ATTR
from .writer import PREFIX

_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>0|[1-9][0-9]*)\.(?P<suffix>[A-Za-z]+)$")

Decoder = Callable[[Path], tuple[dict[str, Any], list[TraceNode]]]
#: the largest comm_groups.json or manifest.json read (a 2**20-rank set's are some 10 MB)
MAX_JSON_BYTES = 1 << 28


def _scan(directory: Path, suffix: str, first: bool = False) -> dict[str, dict[int, Path]]:
    """prefix -> rank -> path of the ``<prefix>.<rank>.<suffix>`` files (``first``: stop
    at the first one).  One pass over the folder; a file's type comes with its entry."""
    found: dict[str, dict[int, Path]] = {}
    if not directory.is_dir():
        return found
    with os.scandir(directory) as entries:
        for entry in entries:
            m = _RANK_FILE.match(entry.name)
            if m and m["suffix"] == suffix and entry.is_file():
                found.setdefault(m["prefix"], {})[int(m["rank"])] = Path(entry.path)
                if first:
                    break
    return found


def detect(directory: Path, suffix: str) -> bool:
    """Whether ``directory`` holds ``<prefix>.<rank>.<suffix>`` files."""
    return bool(_scan(Path(directory), suffix, first=True))


def rank_files(directory: Path, suffix: str) -> tuple[str, list[Path]]:
    """``(prefix, files in rank order)``; ranks must be 0..N-1."""
    prefix, by_rank = _one_prefix(directory, suffix)
    return prefix, _in_rank_order(directory, prefix, suffix, by_rank)


def _in_rank_order(directory: Path, prefix: str, suffix: str, by_rank: dict[int, Path]) -> list[Path]:
    missing = sorted(set(range(max(by_rank) + 1)) - set(by_rank))
    if missing:
        raise ChakraReadError(f"{prefix}.<rank>.{suffix} missing for rank(s) {missing[:8]}", path=directory)
    return [by_rank[r] for r in range(len(by_rank))]


def _one_prefix(directory: Path, suffix: str) -> tuple[str, dict[int, Path]]:
    found = _scan(Path(directory), suffix)
    if not found:
        raise ChakraReadError(f"no <prefix>.<rank>.{suffix} files", path=directory)
    if len(found) > 1:
        if PREFIX not in found:
            raise ChakraReadError(f"several trace prefixes {sorted(found)}; expected one", path=directory)
        found = {PREFIX: found[PREFIX]}
    (prefix, by_rank), = found.items()
    return prefix, by_rank


def read_json(path: Path) -> Any:
    """The JSON document at ``path``; ChakraReadError (naming it) for anything else."""
    try:
        text = read_input(path, path.name, MAX_JSON_BYTES)  # a regular file, bounded (a FIFO would block)
    except UsageError as exc:
        raise ChakraReadError(str(exc).removeprefix(f"{path.name}: "), path=path) from None
    try:
        return json.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ChakraReadError(f"not UTF-8 text ({exc.reason})", path=path, offset=exc.start) from None
    except json.JSONDecodeError as exc:
        raise ChakraReadError(f"not JSON ({exc})", path=path) from None
    except RecursionError:
        raise ChakraReadError("not JSON STAGE reads (nested too deep)", path=path) from None
    except ValueError as exc:  # a number of too many digits
        raise ChakraReadError(f"not JSON STAGE reads ({exc})", path=path) from None


def manifest_world(directory: Path) -> int | None:
    """The world size the set's ``manifest.json`` names; None without one (a set of
    another generator).  A manifest without an integer world size is an error."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        return None
    manifest = read_json(path)
    world = manifest.get("world_size") if isinstance(manifest, dict) else None
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ChakraReadError(f"world_size {world!r} is not a positive integer", path=path)
    return world


def subset(directory: Path) -> tuple[int, list[int]] | None:
    """``(world size, ranks)`` when the set's ``manifest.json`` says it holds only some
    ranks of its world (``stage generate --ranks``); None otherwise."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        return None
    manifest = read_json(path)
    part = manifest.get("subset") if isinstance(manifest, dict) else None
    if part is None:
        return None
    world = manifest.get("world_size")
    if not isinstance(part, dict) or not isinstance(part.get("ranks"), str) or not isinstance(world, int):
        raise ChakraReadError('"subset" must be {"ranks": "0-63,4096", "count": N} beside an integer '
                              '"world_size"', path=path)
    try:
        ranks = parse_ranks(part["ranks"], world, "subset")
    except UsageError as exc:
        raise ChakraReadError(str(exc), path=path) from None
    if part.get("count") != len(ranks):
        raise ChakraReadError(f'"subset" names {len(ranks)} ranks but says "count": {part.get("count")}',
                              path=path)
    return world, ranks


def comm_groups(directory: Path) -> dict[str, list[int]]:
    """The ``comm_groups.json`` beside the traces, or ``{}`` when there is none: an
    object of pg_name -> list of rank numbers, else a ChakraReadError naming the key."""
    path = Path(directory) / "comm_groups.json"
    if not path.exists():
        return {}
    groups = read_json(path)
    if not isinstance(groups, dict):
        raise ChakraReadError('expected an object of pg_name -> [ranks], e.g. {"1": [0, 1]}', path=path)
    for name, members in groups.items():
        if not isinstance(members, list) or not all(
                isinstance(m, int) and not isinstance(m, bool) for m in members):
            raise ChakraReadError(f"group {name!r}: {_short(members)} is not a list of rank numbers", path=path)
    return groups


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _generator(header: dict[str, Any]) -> str:
    """Who wrote the set, as its first file's GlobalMetadata says ("stage <version>"), or ""."""
    found = (header.get("attrs") or {}).get(GENERATOR_ATTR)
    return found[1] if isinstance(found, tuple) and len(found) == 2 and isinstance(found[1], str) else ""


def _check_world(directory: Path, prefix: str, suffix: str, by_rank: dict[int, Path], world: int) -> None:
    """The files must be those of ranks 0..world-1, the manifest's world."""
    missing = sorted(set(range(world)) - set(by_rank))
    extra = sorted(set(by_rank) - set(range(world)))
    if missing or extra:
        names = [f"{prefix}.{r}.{suffix} missing" for r in missing[:4]]
        names += [f"{prefix}.{r}.{suffix} is extra" for r in extra[:4]]
        more = len(missing) + len(extra) - len(names)
        raise ChakraReadError(f"{', '.join(names)}{f' and {more} more' if more else ''} "
                              f"(the manifest's world size is {world})", path=directory)


def open_set(directory: Path, suffix: str, decode: Decoder,
             read_header: Callable[[Path], dict[str, Any]], format_id: str, *,
             file_reader: Callable[[], Decoder] | None = None,
             files_reader: Callable[[list[Path]], Iterator | None] | None = None) -> TraceSet:
    """A lazily read trace set; ``iter_ranks`` decodes one file at a time.

    ``file_reader``, when given, is called at the start of each ``iter_ranks()`` pass
    for the decoder of that pass (so a decoder's state, such as a cache of decoded
    records, lives as long as one pass over the set and no longer).  ``files_reader``,
    when given, may take the pass over instead: called with the files, it gives an
    iterator of ``(metadata, nodes)`` of each, in order, or None to decline.
    """
    directory = Path(directory)
    part = subset(directory)
    prefix, by_rank = _one_prefix(directory, suffix)
    if part is None:
        world = manifest_world(directory)
        if world is not None:
            _check_world(directory, prefix, suffix, by_rank, world)
        files = _in_rank_order(directory, prefix, suffix, by_rank)
        world, ranks = len(files), None
    else:
        world, ranks = part
        if set(by_rank) != set(ranks):
            missing = sorted(set(ranks) - set(by_rank))
            extra = sorted(set(by_rank) - set(ranks))
            what = (f"missing for rank(s) {missing[:8]}" if missing
                    else f"present for rank(s) {extra[:8]} outside the subset")
            raise ChakraReadError(f"the manifest names a subset of ranks; {prefix}.<rank>.{suffix} {what}",
                                  path=directory)
        files = [by_rank[r] for r in ranks]
    header = read_header(files[0])
    # every file of a set has one version: a STAGE set (with a manifest) the one STAGE
    # writes, another the first file's
    expected = ET_VERSION if (directory / "manifest.json").exists() else header["version"]
    generator = _generator(header)

    def iter_ranks() -> Iterator[tuple[int, list[TraceNode]]]:
        many = None if files_reader is None else files_reader(files)
        if many is None:
            decode_file = decode if file_reader is None else file_reader()
            many = map(decode_file, files)
        decoded = iter(many)
        for rank, path in zip(ranks or range(len(files)), files):
            try:
                meta, nodes = next(decoded)
            except ChakraReadError as exc:
                exc.rank = rank if exc.rank is None else exc.rank
                raise
            if not meta["version"]:
                raise ChakraReadError("GlobalMetadata has no version", path=path, rank=rank, offset=0)
            if meta["version"] != expected:
                raise ChakraReadError(f"GlobalMetadata version {meta['version']!r}, but the set's is {expected!r}",
                                      path=path, rank=rank, offset=0)
            if _generator(meta) != generator:  # (one program wrote every file of a set)
                raise ChakraReadError(f"GlobalMetadata generator {_generator(meta)!r}, but the set's is "
                                      f"{generator!r}", path=path, rank=rank, offset=0)
            yield rank, nodes

    return TraceSet(
        world_size=world,
        comm_groups=comm_groups(directory),
        iter_ranks=iter_ranks,
        metadata={"format": format_id, "prefix": prefix, "version": header["version"],
                  "generator": generator},
        ranks=ranks,
    )
