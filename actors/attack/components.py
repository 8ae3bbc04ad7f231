"""The attack-component registry: every transformation, constraint and search method describes
itself — its kind name, role, what it needs offline, whether it needs a white-box victim, its cost
rank (cheap constraints run first), a preflight run on the driver, and how it is built from a
recipe's arguments. Recipes (built in or declared in YAML) are data naming registered components.

Adding a component: one class with `kind`, `role` and `build`, decorated with `@register`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from redline.cluster.plugins import Registry
from redline.errors import RedlineError

ROLES = ("transformation", "pre", "post", "search")


@dataclass(frozen=True)
class BuildContext:
    """What a component may draw on when it is built inside an attacker actor: the attack's
    resources (models, files), the recipe's per-run overrides, and the actor's GPUs."""

    resources: Any  # recipes.AttackResources
    options: Any  # recipes.RecipeOptions
    num_gpus: float = 0.0


class Component:
    kind: ClassVar[str]
    role: ClassVar[str]
    requires: ClassVar[str | None] = None  # what it needs offline, in words (`redline list recipes`)
    white_box: ClassVar[bool] = False  # needs gradients: an `hf` victim
    uses_gpu: ClassVar[bool] = False  # runs a model on the actor's GPU when it has one
    cost: ClassVar[int] = 0  # post constraints: cheapest first, so dear ones see only survivors

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> Any:
        return cls(**args)

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        """Cheap checks on the driver before any actor starts (missing models, files, data)."""

    @classmethod
    def is_white_box(cls, args: dict[str, Any]) -> bool:
        return cls.white_box

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        """A declared recipe's arguments must be ones this component takes."""
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return
        unknown = sorted(set(args) - set(params) - {"self"})
        if unknown:
            raise RedlineError(f"{cls.role} '{cls.kind}' takes no argument {', '.join(map(repr, unknown))} "
                               f"(it takes: {', '.join(p for p in params if p != 'self') or 'none'})")


def _load() -> tuple[type[Component], ...]:
    from redline.actors.attack import constraints, search, transformations  # noqa: F401  (they register)

    return ()


# one registry per role; the component modules register their classes as they are imported
COMPONENTS: dict[str, Registry[type[Component]]] = {role: Registry(role, lambda cls: cls.kind, _load) for role in ROLES}


def register(cls: type[Component]) -> type[Component]:
    if cls.role not in ROLES:
        raise ValueError(f"{cls.__name__}: unknown role {cls.role}")
    return COMPONENTS[cls.role].register(cls)


def component(role: str, kind: str) -> type[Component]:
    return COMPONENTS[role].get(kind)


def components(role: str) -> dict[str, type[Component]]:
    return dict(sorted(COMPONENTS[role].all().items()))
