"""PromptDPSGD's section of a run's configuration (`RunConfig.dpsgd`; Duan et al. Section 4.1, App. C.1).

What a run sets of PromptDPSGD: what trains (a soft prompt, a prefix, or a fine-tuning baseline) and DP-SGD's
parameters (C, the expected batch, T or epochs, the learning rate). An unset one is the preset's: training's
`dpsgd_config` (`dpcore.dpsgd.training`) resolves the section into the `DpsgdConfig` that trains, every parameter
set and checked. Outside Python each field keeps its flat name `dpsgd_<field>` (`--dpsgd-steps`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpcore.names import PromptInit, TuneKind
from dpcore.section import Section


class DpsgdSection(Section):
    """PromptDPSGD's settings (flat names `dpsgd_*`); None: the preset's."""

    PREFIX = "dpsgd_"

    kind: TuneKind = Field(
        "soft-prompt", description="what trains: soft-prompt (s input embeddings) or prefix (keys and values at "
        "every layer, P-tuning v2); the DP fine-tuning baselines lora (rank-r adapters on q_proj/v_proj) or full "
        "(every weight)")
    preset: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="defaults of the unset dpsgd_* fields: gpu = Duan et al. Table 6 (C 0.1, batch 1024, "
        "length 10, 100 epochs, lr 0.005), cpu = minutes on the embedded model; auto: by device")
    length: int | None = Field(None, ge=1, description="s: prompt positions (default: the preset's, 10)")
    rank: int | None = Field(None, description="LoRA rank r for --kind lora (default 8)")
    init: PromptInit | None = Field(
        None, description="P_0: embeddings of random vocabulary tokens (vocab), random, or the embeddings of the "
        "task's instruction tokens (instruction); default: the preset's (instruction on CPU, vocab on GPU)")
    clip: float | None = Field(None, gt=0, description="C: per-example gradient norm bound (default: 0.1)")
    batch_size: int | None = Field(None, ge=1, description="expected Poisson batch size qN (default: "
                                   "the preset's)")
    epochs: float | None = Field(None, gt=0, description="epochs: T = epochs / q steps (default: the "
                                 "preset's)")
    steps: int | None = Field(None, ge=1, description="T directly (overrides dpsgd_epochs)")
    lr: float | None = Field(None, gt=0, description="learning rate (AdamW, linear decay to 0)")
    physical_batch_size: int | None = Field(None, ge=1, description="examples per forward/backward "
                                            "(memory only; default: the preset's)")
    validation_size: int | None = Field(None, ge=0, description="public labelled examples for the loss "
                                        "curve (never private records; default: the preset's, 64 on CPU, "
                                        "500 on GPU)")
    validation_path: str | None = Field(None, description="a labelled file you declare public (the data "
                                        "file's columns) for the loss curve of your own data; a shipped "
                                        "task uses its public split; without either, no curve")
    seeds: int = Field(1, ge=1, description="independent trainings (accuracy mean +/- std over them); "
                       "each is charged to the ledger")


__all__ = ["DpsgdSection"]
