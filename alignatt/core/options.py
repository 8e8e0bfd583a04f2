"""An options model's fields as knobs: the one declaration that the CLI and params.yaml both read.

A knob is a field of a pydantic options model (`SoakOptions`, `LoadOptions`, `ServerConfig`, ...):
its default and its `description` are the only ones. On the command line it is `--field-name`,
and also `--old-name` for each older name its `validation_alias` lists (`AliasChoices("stagger_s",
"stagger")`), so params.yaml sections and documented commands keep working. A list field is one
comma-separated value there (`--speakers 1,2,4`, `speakers: "1,2,4"`); a list of models is a repeated
option (`--configurations key=value,...` once per item) and a YAML list. `flat_fields` turns such
flat values into the model's fields and refuses a key no field knows (nanoGPT's "Unknown config
key"); the model validates the rest. `alignatt.cli.options` builds the typer options from here.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Mapping

from pydantic import AliasChoices, BaseModel, ValidationError

from alignatt.core.errors import AlignattError


def one_line(error: ValidationError, prefix: str = "") -> str:
    """A pydantic error as one line: the first bad field and why (the rest follow from fixing it)."""
    first = error.errors()[0]
    where = ".".join(map(str, first["loc"]))
    why = first["msg"].removeprefix("Value error, ")  # a validator's own message says it all
    return f"{prefix}{where}: {why}" if where else f"{prefix}{why}"


def knob_names(model: type[BaseModel], field: str) -> list[str]:
    """The field's names as a knob: its own first, then the older ones its validation_alias lists."""
    alias = model.model_fields[field].validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if isinstance(alias, str) else []
    return [field] + [c for c in choices if isinstance(c, str) and c != field]


def _plain(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), optional
    return annotation, False


def is_model_list(model: type[BaseModel], field: str) -> bool:
    """A list of models (the capacity benchmark's configurations): a command line repeats its option,
    one item each (`--configurations key=value,...`), and no value of it is split at commas."""
    plain = _plain(model.model_fields[field].annotation)[0]
    item = (typing.get_args(plain) or (None,))[0]
    return typing.get_origin(plain) is list and isinstance(item, type) and issubclass(item, BaseModel)


def is_list(model: type[BaseModel], field: str) -> bool:
    """A comma-separated list knob (`--speakers 1,2,4`)."""
    return typing.get_origin(_plain(model.model_fields[field].annotation)[0]) is list and not is_model_list(model, field)


def knob_type(model: type[BaseModel], field: str) -> tuple[type, list[str] | None]:
    """(the type a command line parses the field as, its choices or None). A list is one
    comma-separated string, a list of models a repeated option; a union of a number and a word
    (`int | Literal["auto"]`) a string the model parses. TypeError for a field no command line can
    give (a mapping, a nested model): its model lists it in `exclude` where it builds its options."""
    plain, _ = _plain(model.model_fields[field].annotation)
    origin = typing.get_origin(plain)
    if plain in (bool, int, float, str):
        return plain, None
    if origin is Literal:
        return str, [str(v) for v in typing.get_args(plain)]
    if is_model_list(model, field):
        return list[str], None
    if origin is list:
        return str, None
    if origin is typing.Union and all(a in (int, float, str) or typing.get_origin(a) is Literal
                                      for a in typing.get_args(plain)):
        return str, None
    raise TypeError(f"{model.__name__}.{field} ({plain}) cannot be a command-line option: exclude it")


def shown_default(model: type[BaseModel], field: str) -> str | None:
    """The field's default as a command line writes it (None: no default to show)."""
    value = model.model_fields[field].get_default(call_default_factory=True)
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):  # comma-separated; a tuple item as `a@b` (failover's kill@25)
        return ",".join("@".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
                        if isinstance(v, tuple) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def split_list(value: Any) -> Any:
    """A comma-separated string as a list (items stripped, empty ones dropped); anything else as is."""
    return [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value


def flat_fields(model: type[BaseModel], values: Mapping[str, Any], where: str = "option") -> dict[str, Any]:
    """Flat knob values (a command line's, a params.yaml section's) as the model's fields: each key
    by its name or an older one, a list field's comma-separated string split. AlignattError naming
    a key that no field knows."""
    by_name = {name: field for field in model.model_fields for name in knob_names(model, field)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        field = by_name.get(key.replace("-", "_"))
        if field is None:
            raise AlignattError(f"unknown {where} {key!r}: {model.__name__} has no such field")
        out[field] = split_list(value) if is_list(model, field) else value
    return out


def validate_flat(model: type[BaseModel], values: Mapping[str, Any], where: str = "option") -> BaseModel:
    """`model` from flat knob values; an unknown key or a bad value is one line (AlignattError)."""
    try:
        return model.model_validate(flat_fields(model, values, where))
    except ValidationError as e:
        raise AlignattError(one_line(e, f"bad {where} ")) from None
