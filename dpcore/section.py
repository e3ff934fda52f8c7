"""A method's section of `RunConfig`: its settings as one typed, frozen model, and their flat names.

Each private-prompting method (and the audit) declares its section in its own subsystem
(`dpcore/<method>/config.py`), with the validators of its fields; `dpcore/config.py` composes the sections into
`RunConfig` (`RunConfig.pate`, `RunConfig.dpsgd`, ...). Outside Python a section's field keeps one flat name,
`PREFIX + field` (`pate_teachers` for `PateSection.teachers`), or the name `FLAT_NAMES` gives it: the CLI flag
(`--pate-teachers`), the key of a `prefect.yaml` deployment or a stored run configuration, the MLflow param. This
module sits below every section so that a section names its own flags without importing `dpcore.config`; a
section's flat names are registered with `dpcore.flags` when its class is declared, so `flag` names them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from dpcore.flags import named, register


class Section(BaseModel):
    """One section of `RunConfig`. A subclass sets `PREFIX` (its flat names' prefix, `pate_`) and, for a field whose
    flat name is not `PREFIX + field` (the audit's switch is `audit`, its gate's `leak_auc`), `FLAT_NAMES`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    PREFIX: ClassVar[str] = ""
    FLAT_NAMES: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        register(cls.flat_name(field) for field in cls.model_fields)  # `flag` names them from now on

    @classmethod
    def flat_name(cls, field: str) -> str:
        """The field's flat name: its flag without the dashes, its key in prefect.yaml and MLflow params."""
        return cls.FLAT_NAMES.get(field, cls.PREFIX + field)

    @classmethod
    def flag(cls, field: str, value: Any = None) -> str:
        """How a message names the field (`named`): `PateSection.flag("teachers")` -> `--pate-teachers
        (pate_teachers)`."""
        return named(cls.flat_name(field), value)


__all__ = ["Section"]
