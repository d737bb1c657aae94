"""Name -> factory registries (a leaf module).

Strategies register themselves under a short name, so that configs and the CLI can
refer to them by name and list the choices in error messages::

    PARTITIONERS = Registry("partitioner")

    @PARTITIONERS.register("random")
    def random_partition(...): ...

    PARTITIONERS.get("random")  # -> the function, or a ConfigError listing the names
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from commgnn.errors import ConfigError

F = TypeVar("F")


class Registry(Generic[F]):
    """A case-sensitive mapping from names to strategy factories."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(obj: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} '{name}' (choose from: {', '.join(sorted(self._items))})") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
