"""Reading a pipeline file's YAML safely: bounded in size, depth and alias expansion, never a traceback.

A pipeline file is small and hand-written, so anything far beyond that is refused with one line before it
can cost time or memory:

* files over :data:`MAX_FILE_BYTES` are refused unread (only that many bytes are ever read, so a device or
  a growing file is refused too), and so are files of more than :data:`MAX_VALUES` values -- counted while
  libyaml parses, so that a megabyte of ``- 1`` lines costs milliseconds, not the seconds it takes to
  build its nodes;
* anchors and aliases are allowed -- ``<<: *defaults`` merge keys are how real pipeline files share their
  Kafka settings -- but an alias inside the value it refers to (``a: &a [*a]``) is refused, and so is a
  file whose aliases expand to more than :data:`MAX_VALUES` values (an "alias bomb": nine levels of nine
  aliases each are a few hundred bytes and 387 million values);
* nesting deeper than :data:`MAX_DEPTH` is refused, so that nothing after parsing recurses deeply;
* values YAML itself cannot construct (``2001-13-45`` reads as a date and fails) become a one-line message.

Everything here works on the composed node graph before any Python value is built, without recursion.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1024 * 1024  # a pipeline is a few kilobytes; a prompt or a JSON schema in it, a few more
MAX_VALUES = 20_000  # scalars, lists and mappings, after expanding aliases; a pipeline has about a hundred
MAX_DEPTH = 100  # levels of nesting; a pipeline has about five, a JSON schema in engine options a few more

YamlPath = tuple[str | int, ...]

# libyaml's parser when the PyYAML build has it: much faster, and it bounds nesting itself
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlProblem(Exception):
    """The file cannot be read as a pipeline's YAML; ``str(err)`` is one line for the user."""


def read_text(path: str | Path) -> str:
    """The file's text, read up to :data:`MAX_FILE_BYTES` (and one byte more, to know it is over)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:  # a regular file: refused unread
                raise YamlProblem(_too_big(size))
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise YamlProblem(f"cannot read the file: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:  # a device, a pipe, a file that grew
        raise YamlProblem(_too_big(None))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlProblem(f"the file is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def load_yaml(text: str) -> tuple[Any, dict[YamlPath, int]]:
    """Parse one YAML document: (its value, the 1-based line of each path in it). Raises YamlProblem."""
    if len(text) > MAX_FILE_BYTES:
        raise YamlProblem(_too_big(len(text.encode("utf-8", "replace"))))
    loader = _Loader(text)
    try:
        count_events(text)
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer recurses per level of nesting
            raise YamlProblem(f"the YAML nests more than {MAX_DEPTH} levels deep; a pipeline needs a handful") from None
        if node is None:
            return None, {}
        check_graph(node)
        try:
            data = loader.construct_document(node)
        except yaml.YAMLError:
            raise
        except Exception as err:  # a scalar YAML resolves to a type it then cannot build
            raise YamlProblem(f"YAML cannot read one of the values ({type(err).__name__}: {_first_line(err)}); "
                              "if it is meant as text, put it in quotes") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or _first_line(err)
        if "nesting depth" in problem:  # libyaml's own bound on nesting
            raise YamlProblem(f"{where}the YAML nests too deeply; a pipeline needs a handful of levels") from None
        raise YamlProblem(f"{where}YAML syntax error: {problem}") from None
    finally:
        loader.dispose()
    return data, line_index(node)


def count_events(text: str) -> None:
    """A first pass over the parser's events, stopping early: more than :data:`MAX_VALUES` values, or
    nesting past :data:`MAX_DEPTH`, is refused before any node is built. Raises YamlProblem (or the
    parser's own YAMLError)."""
    loader = _Loader(text)
    try:
        num_values = depth = 0
        while (event := loader.get_event()) is not None:
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                num_values += 1
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                num_values += 1
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlProblem(f"line {_line(event)}: the YAML nests more than {MAX_DEPTH} levels deep; "
                                      "a pipeline needs a handful")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
            if num_values > MAX_VALUES:
                raise YamlProblem(f"the file holds more than {MAX_VALUES:,} values (line {_line(event)} and on); "
                                  "a pipeline needs far fewer (is this the right file?)")
    finally:
        loader.dispose()


def check_graph(root: yaml.Node) -> None:
    """Refuse alias loops, expansion past :data:`MAX_VALUES` and nesting past :data:`MAX_DEPTH`.

    Aliases make the composed nodes a graph: a shared node is one object however often it is referred to.
    An iterative depth-first walk visits each node once, knows which nodes are open above the current one
    (an alias to one of those is a loop) and sums each node's size as if every alias were written out.
    """
    size: dict[int, int] = {}  # node id -> values in its expanded subtree (itself included)
    depth: dict[int, int] = {}  # node id -> levels in its expanded subtree
    open_nodes: set[int] = set()  # ids of the nodes on the path from the root to the current one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        nid = id(node)
        if leaving:
            children = _children(node)
            size[nid] = 1 + sum(size[id(c)] for c in children)
            depth[nid] = 1 + max((depth[id(c)] for c in children), default=0)
            open_nodes.discard(nid)
            if size[nid] > MAX_VALUES:
                raise YamlProblem(f"aliases expand this file to more than {MAX_VALUES:,} values (an alias bomb?); "
                                  "a pipeline needs far fewer: write the repeated parts out, or alias less")
            if depth[nid] > MAX_DEPTH:
                raise YamlProblem(f"line {_line(node)}: the YAML nests more than {MAX_DEPTH} levels "
                                  "deep; a pipeline needs a handful")
            continue
        if nid in size:
            continue
        open_nodes.add(nid)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise YamlProblem(f"line {_line(child)}: an alias refers to the value it is part of "
                                  "(like `a: &a [*a]`); a value cannot contain itself")
            if id(child) not in size:
                stack.append((child, False))


def line_index(root: yaml.Node | None) -> dict[YamlPath, int]:
    """Map each YAML path to the 1-based line where its value (or key) starts. Iterative; the graph
    must have passed :func:`check_graph` (so its expansion is bounded)."""
    out: dict[YamlPath, int] = {}
    stack: list[tuple[yaml.Node, YamlPath]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        out.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = (*path, str(key_node.value))
                out[child] = key_node.start_mark.line + 1  # a key's line wins over its value's
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(node.value))
    return out


def _line(item: yaml.Event | yaml.Node) -> int | str:
    mark = item.start_mark
    return mark.line + 1 if mark is not None else "?"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _too_big(size: int | None) -> str:
    limit = f"{MAX_FILE_BYTES / 2**20:g} MiB"
    shown = f"{size / 1e6:.1f} MB" if size is not None else f"over {limit}"
    return f"the file is {shown}; a pipeline file is at most {limit} (is this the right file?)"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 200 else line[:200] + "..."
