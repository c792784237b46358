"""The model's module tree: which module owns each trainable parameter, and how modules nest.

FSDP2 shards by module: ``fully_shard(m)`` (or ``fully_shard([m1, m2])``) takes the parameters of
the modules' subtrees that no nested ``fully_shard`` took already. A sharded plan's units are lists
of module paths, so the graph records

- ``types``: module path -> the module's class name (``""`` is the root; ``"?"`` where the importer
  could not know it, as for ONNX files, whose initializer names give only the paths), and
- ``children``: module path -> its children's names in registration order,
- ``owners``: parameter name -> the path of the module it is registered on (its name's prefix).

Example:
    >>> tree = ModuleTree.from_param_names(["h.0.fc.weight", "h.1.fc.weight", "wte.weight"])
    >>> tree.children[""], tree.children["h"]
    (('h', 'wte'), ('0', '1'))
    >>> sorted(tree.params_under("h.1"))
    ['h.1.fc.weight']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import InvalidGraphError

__all__ = ["ModuleTree", "owner_of", "child_path"]


def owner_of(param_name: str) -> str:
    """The path of the module a parameter named ``param_name`` is registered on (``""``: the root)."""
    return param_name.rpartition(".")[0]


def child_path(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child


@dataclass(frozen=True, slots=True)
class ModuleTree:
    """Module types, children in registration order, and each parameter's owning module."""

    types: Mapping[str, str]
    children: Mapping[str, tuple[str, ...]]
    owners: Mapping[str, str]

    def __post_init__(self) -> None:
        if "" not in self.types:
            raise InvalidGraphError("the module tree has no root module ''")
        for path, kids in self.children.items():
            for kid in kids:
                if child_path(path, kid) not in self.types:
                    raise InvalidGraphError(f"module {path!r} lists child {kid!r}, which is not in the module tree")
        for param, path in self.owners.items():
            if path not in self.types:
                raise InvalidGraphError(f"parameter {param!r} is owned by module {path!r}, which is not in the tree")

    @classmethod
    def from_param_names(cls, names: Iterable[str], types: Mapping[str, str] | None = None) -> ModuleTree:
        """The tree that parameter names imply: every dotted prefix is a module, children in first-seen order."""
        types = dict(types or {})
        children: dict[str, list[str]] = {"": []}
        owners = {}
        for name in names:
            owners[name] = owner_of(name)
            parent = ""
            for part in owners[name].split(".") if owners[name] else ():
                path = child_path(parent, part)
                if path not in children:
                    children[path] = []
                    children[parent].append(part)
                parent = path
        return cls(types={path: types.get(path, "?") for path in children},
                   children={path: tuple(kids) for path, kids in children.items()}, owners=owners)

    # ----------------------------------------------------------------- queries

    def child_paths(self, path: str) -> list[str]:
        return [child_path(path, kid) for kid in self.children.get(path, ())]

    def is_within(self, path: str, ancestor: str) -> bool:
        """True when ``path`` is ``ancestor`` or nested in it."""
        return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")

    def params_under(self, path: str) -> list[str]:
        """The parameters of ``path``'s subtree, in the order of :attr:`owners`."""
        return [p for p, owner in self.owners.items() if self.is_within(owner, path)]

    def largest_repeated_container(self) -> str | None:
        """The container of repeated blocks with the most of them (torchtitan's blocks), or None.

        A ``ModuleList`` or ``Sequential`` with at least two children that hold parameters qualifies;
        where the importer could not know types (``"?"``), a module whose children that hold
        parameters all hold the same parameter names. Ties: the first in the tree."""
        best, best_count = None, 1
        for path, kind in self.types.items():
            kids = [c for c in self.child_paths(path) if self.params_under(c)]
            if len(kids) <= best_count:
                continue
            if kind in ("ModuleList", "Sequential") or (kind == "?" and len(set(map(self._signature, kids))) == 1):
                best, best_count = path, len(kids)
        return best

    def _signature(self, path: str) -> tuple[str, ...]:
        """The parameter names of ``path``'s subtree relative to it (what repeated blocks share)."""
        return tuple(sorted(p[len(path) + 1:] for p in self.params_under(path)))

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {"types": dict(self.types), "children": {p: list(k) for p, k in self.children.items()},
                "owners": dict(self.owners)}

    @classmethod
    def from_json(cls, data: Any) -> ModuleTree:
        if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("types", "children", "owners")):
            raise InvalidGraphError("graph JSON field modules: expected an object with types, children and owners")
        children = {}
        for path, kids in data["children"].items():
            if not (isinstance(kids, list) and all(isinstance(k, str) for k in kids)):
                raise InvalidGraphError(f"graph JSON field modules.children.{path}: expected a list of names")
            children[path] = tuple(kids)
        for field in ("types", "owners"):
            if not all(isinstance(v, str) for v in data[field].values()):
                raise InvalidGraphError(f"graph JSON field modules.{field}: expected strings")
        return cls(types=dict(data["types"]), children=children, owners=dict(data["owners"]))
