"""A command's options built from its options model: vLLM's `get_kwargs(SchedulerConfig)` for typer.

    @app.command("soak")
    @model_options(SoakOptions)
    def soak_cmd(out: str = typer.Option(None, help=...), **fields) -> None:
        options = validated(SoakOptions, "soak option ", **fields)

`model_options` gives the command one option per field of each source model (`alignatt.core.options`
says how a field becomes a knob: names, type, list as comma-separated), with the field's description
as its help and its default as the shown default. An option left out is not passed: the model's
own default applies, so the default is declared once. The command's own parameters are the options
that are no field (`--out`, `--config`, ...). tests/test_one_declaration.py holds every command to it.

A stage command (smoke, load, eval) also takes `--profile` and `--params`: the profile's section of
params.yaml gives its options, the flags given override them (`pipeline/params.py:stage_options`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Callable

import typer
from pydantic import BaseModel

from alignatt.core.options import is_list, knob_names, knob_type, shown_default, split_list


@dataclass(frozen=True)
class Knobs:
    """The fields of `model` a command takes: all (`only` None) but `exclude`."""

    model: type[BaseModel]
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    def fields(self) -> list[str]:
        names = list(self.only) if self.only is not None else list(self.model.model_fields)
        return [f for f in names if f not in self.exclude]


@dataclass(frozen=True)
class CommandKnobs:
    """What `model_options` recorded on a command, for the test that holds it to its models."""

    sources: tuple[Knobs, ...]
    own: tuple[str, ...]  # the command's own parameters: options that are no field
    shown: dict[str, str] = dataclass_field(default_factory=dict)  # a default shown other than the field's

    def field_of(self, param: str) -> tuple[type[BaseModel], str] | None:
        for source in self.sources:
            if param in source.fields():
                return source.model, param
        return None


_CONTEXT = "_alignatt_context"


def was_given(ctx: typer.Context, name: str) -> bool:
    """Whether the command's parameter `name` was given (command line, environment), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def profile_option(section: str) -> Any:
    """`--profile NAME`: the params profile whose `section` gives a stage command's options."""
    return typer.Option(None, help=f"params profile whose {section} section, model, device and dtype give the "
                                   "options; the options given here override them (default: none, the options alone)")


def params_option() -> Any:
    return typer.Option("params.yaml", help="params file of --profile")


def _dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def knob_option(model: type[BaseModel], field: str, shown: str | None = None,
                names: list[str] | None = None) -> tuple[Any, type]:
    """(the typer option of one field, the type typer parses it as). Its default is the field's
    (`shown` where the command resolves its own), as the command line writes it. `names`: the
    option's names where they are not the field's (a nested model's field, flat: eval's
    `--tail-p-wrong` for TailNoise.p_wrong)."""
    kind, choices = knob_type(model, field)
    names = names or knob_names(model, field)
    decls = [f"{_dashed(n)}/--no-{n.replace('_', '-')}" for n in names] if kind is bool else [_dashed(n) for n in names]
    if shown is not None:
        default = shown
    elif kind in (bool, int, float) or choices:
        default = model.model_fields[field].get_default(call_default_factory=True)
    else:
        default = shown_default(model, field)
    option = typer.Option(default, *decls, help=model.model_fields[field].description)
    # A Literal is parsed as a string: the model refuses a bad value in one line (exit 2), where a
    # click choice would print its usage box.
    return option, kind


def model_options(*sources: type[BaseModel] | Knobs, shown: dict[str, str] | None = None) -> Callable:
    """Decorator: the command takes one option per field of `sources`; given ones reach it as
    keyword arguments by field name (a list field as a list). `shown`: a default the command
    resolves itself where the field's differs (serve's `settle_buffer_tokens: auto`). A command that
    declares a `typer.Context` parameter gets the context (to ask `was_given` of its own options)."""
    knobs = tuple(s if isinstance(s, Knobs) else Knobs(s) for s in sources)

    def decorate(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(func).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in own}
        own_context = next((p.name for p in own if p.annotation is typer.Context), None)
        fields: dict[str, tuple[type[BaseModel], str]] = {}
        generated = []
        for source in knobs:
            for name in source.fields():
                if name in taken or name in fields:
                    raise TypeError(f"{func.__name__}: option {name!r} is declared twice")
                option, kind = knob_option(source.model, name, (shown or {}).get(name))
                fields[name] = (source.model, name)
                generated.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                                   annotation=kind))

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            ctx = kwargs[own_context] if own_context else kwargs.pop(_CONTEXT)
            given = {}
            for name, (model, field) in fields.items():
                value = kwargs.pop(name)
                if was_given(ctx, name):
                    given[field] = split_list(value) if is_list(model, field) else value
            return func(**kwargs, **given)

        context = inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        # typer passes its context to a typer.Context parameter (one: the command's own, else this)
        parameters = generated + own + ([] if own_context else [context])
        command.__signature__ = inspect.Signature(parameters, return_annotation=None)
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.alignatt_knobs = CommandKnobs(knobs, tuple(p.name for p in own), dict(shown or {}))  # type: ignore[attr-defined]
        return command

    return decorate
