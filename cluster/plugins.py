"""The one registry type: named plugins of one kind (detector kinds, chat-model providers, attack
components of a role, pipelines). Built-ins are listed by a function run on first use, so a heavy
plugin module is imported only when its registry is asked; a plugin from outside adds itself with
`register` (a class decorator) and configs accept its name at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from redline.errors import RedlineError

T = TypeVar("T")


class Registry(Generic[T]):
    """Plugins of one kind by name (`name_of(plugin)`). `built_in()` returns the built-in plugins, or
    imports modules whose plugins `register` themselves; it runs once, before the first lookup."""

    def __init__(self, what: str, name_of: Callable[[T], str],
                 built_in: Callable[[], Iterable[T]] | None = None) -> None:
        self.what, self.name_of, self._built_in = what, name_of, built_in
        self._plugins: dict[str, T] = {}
        self._loaded = built_in is None

    def register(self, plugin: T) -> T:
        """Adds `plugin` under its name (usable as a class decorator). Two plugins under one name are
        a bug where they are defined, not a choice made by import order."""
        name = self.name_of(plugin)
        if self._plugins.get(name, plugin) is not plugin:
            raise ValueError(f"two {self.what}s named '{name}'")
        self._plugins[name] = plugin
        return plugin

    def all(self) -> dict[str, T]:
        """Every plugin by name, built-ins first, in the order they were listed or registered."""
        if not self._loaded:
            self._loaded = True
            for plugin in self._built_in() or ():
                self.register(plugin)
        return dict(self._plugins)

    def get(self, name: str) -> T:
        """The plugin named `name`; a user's unknown name is one line listing the known ones."""
        plugins = self.all()
        if name not in plugins:
            raise RedlineError(f"unknown {self.what} '{name}' (known: {', '.join(sorted(plugins))})")
        return plugins[name]

    def __contains__(self, name: object) -> bool:
        return name in self.all()
