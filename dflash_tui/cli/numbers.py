"""Numbers on the command line: every numeric flag of every command takes a finite value in its range, or
is refused in one sentence with exit 2 (click's usage error), before anything loads.

click's own FLOAT reads 'inf', 'nan' and '1e400' (infinity) as floats, and its INT reads an integer of
any length; a FloatRange lets NaN through (every comparison with it is false). The types here add what
they miss: a float is finite, an integer fits in 64 bits (what torch, numpy and the OS take). `checked`
walks a command tree once and gives every numeric parameter one of these types, keeping its range, so a
flag added later is covered without a word of its own."""

from __future__ import annotations

import math
from typing import Any, Optional

import click

INT_LOW, INT_HIGH = -(2**63), 2**63 - 1  # a signed 64-bit integer


def _finite(kind: click.ParamType, value: float, param, ctx) -> float:
    if not math.isfinite(value):
        kind.fail(f"{value} is not a finite number.", param, ctx)
    return value


def _in_64_bits(kind: click.ParamType, value: int, param, ctx) -> int:
    if not INT_LOW <= value <= INT_HIGH:
        shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:24]}..."
        kind.fail(f"{shown} does not fit in a 64-bit integer (from {INT_LOW} to {INT_HIGH}).", param, ctx)
    return value


class FiniteFloat(click.types.FloatParamType):
    """FLOAT without infinity and NaN."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        return _finite(self, super().convert(value, param, ctx), param, ctx)


class FiniteFloatRange(click.FloatRange):
    """FloatRange without infinity and NaN."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        number = _finite(self, click.FLOAT.convert(value, param, ctx), param, ctx)
        return super().convert(number, param, ctx)


class Int64(click.types.IntParamType):
    """INT that fits in 64 bits."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        return _in_64_bits(self, super().convert(value, param, ctx), param, ctx)


class Int64Range(click.IntRange):
    """IntRange that fits in 64 bits."""

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        return _in_64_bits(self, super().convert(value, param, ctx), param, ctx)  # its range first, then 64 bits


CHECKED = (FiniteFloat, FiniteFloatRange, Int64, Int64Range)


def checked_type(kind: click.ParamType) -> click.ParamType:
    """The checked counterpart of a numeric click type (its range kept); any other type unchanged."""
    if isinstance(kind, CHECKED):
        return kind
    if isinstance(kind, click.FloatRange):
        return FiniteFloatRange(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
    if isinstance(kind, click.IntRange):
        return Int64Range(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
    if isinstance(kind, click.types.FloatParamType):
        return FiniteFloat()
    if isinstance(kind, click.types.IntParamType):
        return Int64()
    return kind


def checked(command: click.Command) -> click.Command:
    """`command` and every subcommand with each numeric parameter's type checked (in place)."""
    for param in command.params:
        param.type = checked_type(param.type)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            checked(sub)
    return command
