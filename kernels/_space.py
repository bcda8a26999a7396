"""Parameter spaces: the one place where a family declares what can be tuned.

The tuner (optuna), the service's ``/kernels`` endpoint and the docs all read
these declarations, so a parameter's name, its allowed values, its default and
when it is active are written exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.errors import InvalidConfigError

if TYPE_CHECKING:
    import optuna

Value = int | float | str


@dataclass(frozen=True)
class Param:
    """One tunable: an ordered set of allowed values and the default among them.

    ``when`` makes the parameter conditional: it is active only when every named
    parameter takes one of the listed values (optuna's define-by-run space then
    never asks for it otherwise).
    """

    name: str
    values: tuple[Value, ...]
    default: Value
    doc: str
    when: Mapping[str, tuple[Value, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"default {self.default!r} of {self.name!r} is not among {self.values}")

    def active(self, params: Mapping[str, Value]) -> bool:
        return all(params.get(k) in allowed for k, allowed in self.when.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "values": list(self.values),
            "default": self.default,
            "doc": self.doc,
            "when": {k: list(v) for k, v in self.when.items()},
        }


@dataclass(frozen=True)
class Space:
    """An ordered collection of :class:`Param`; conditions refer to earlier params."""

    params: tuple[Param, ...] = ()

    def defaults(self) -> dict[str, Value]:
        return self.validate({})

    def validate(self, params: Mapping[str, Any], *, family: str = "") -> dict[str, Value]:
        """Fill defaults, drop inactive params, reject unknown names and values.

        Raises :class:`InvalidConfigError` that lists what is allowed.
        """
        known = {p.name for p in self.params}
        unknown = sorted(set(params) - known)
        where = f" of kernel {family!r}" if family else ""
        if unknown:
            raise InvalidConfigError(
                f"unknown parameter(s) {unknown}{where}; allowed: {sorted(known) or 'none'}"
            )
        out: dict[str, Value] = {}
        for p in self.params:
            if not p.active(out):
                continue
            value = params.get(p.name, p.default)
            if value not in p.values:
                raise InvalidConfigError(
                    f"{p.name}={value!r} is not allowed{where}; allowed: {list(p.values)}"
                )
            out[p.name] = value
        return out

    def suggest(self, trial: optuna.trial.BaseTrial, *, prefix: str) -> dict[str, Value]:
        """Ask optuna for one config, parameter names prefixed so families never collide."""
        out: dict[str, Value] = {}
        for p in self.params:
            if p.active(out):
                out[p.name] = trial.suggest_categorical(f"{prefix}.{p.name}", list(p.values))
        return out

    def to_dict(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.params]

    def configs(self) -> list[dict[str, Value]]:
        """Every distinct config, conditions taken into account (for small spaces and tests)."""
        configs: list[dict[str, Value]] = [{}]
        for p in self.params:
            grown: list[dict[str, Value]] = []
            for c in configs:
                if p.active(c):
                    grown.extend({**c, p.name: v} for v in p.values)
                else:
                    grown.append(c)
            configs = grown
        return configs
