"""RunConfig's sections (`dpcore.config`, `dpcore.section`, `dpcore/<method>/config.py`): each method's settings a
typed section (`config.pate.teachers`), the run's external form flat as it was before the sections (the CLI flags,
`RunConfig(pate_teachers=8)`, a stored run's configuration, prefect.yaml, MLflow params)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dpcore.adadpsyn.config import AdaDPSynSection
from dpcore.audit.config import AuditSection
from dpcore.config import SECTIONS, AuditConfig, RunConfig, flag
from dpcore.dp_icl.config import DpIclSection
from dpcore.dp_opt.config import DpOptSection
from dpcore.dpsgd.config import DpsgdSection
from dpcore.pate.config import PateSection

REPO = Path(__file__).resolve().parents[1]

# Every flag `dpicl run` built from RunConfig before the sections, in its order, with a value it takes and the
# value the configuration then holds (by the field's flat name): the contract the sections keep. A switch's
# argument list is the flag alone.
RUN_FLAGS: list[tuple[str, str, list[str], object]] = [
    ("--methods", "methods", ["tang,pate"], ["tang", "pate"]),
    ("--dataset", "dataset", ["sst2"], "sst2"),
    ("--data-path", "data_path", ["records.csv"], "records.csv"),
    ("--test-path", "test_path", ["test.csv"], "test.csv"),
    ("--task-spec", "task_spec", ["sst2"], "sst2"),
    ("--dataset-id", "dataset_id", ["mine"], "mine"),
    ("--new-budget-for-same-records", "new_budget_for_same_records", [], True),
    ("--model", "model", ["tiny-random"], "tiny-random"),
    ("--device", "device", ["cpu"], "cpu"),
    ("--dtype", "dtype", ["float32"], "float32"),
    ("--epsilons", "epsilons", ["1,inf"], [1.0, math.inf]),
    ("--delta", "delta", ["1e-5"], 1e-5),
    ("--mechanism", "mechanism", ["rnm"], "rnm"),
    ("--sampler", "sampler", ["fixed"], "fixed"),
    ("--num-subsets", "num_subsets", ["3"], 3),
    ("--subset-size", "subset_size", ["2"], 2),
    ("--top-k", "top_k", ["50"], 50),
    ("--no-rvp", "rvp", [], False),
    ("--max-tokens", "max_tokens", ["12"], 12),
    ("--max-record-tokens", "max_record_tokens", ["64"], 64),
    ("--seed", "seed", ["7"], 7),
    ("--shots", "shots", ["2"], 2),
    ("--seeds", "seeds", ["3"], 3),
    ("--test-size", "test_size", ["30"], 30),
    ("--calibrate", "calibrate", [], True),
    ("--baselines", "baselines", ["zero-shot,random-real"], ["zero-shot", "random-real"]),
    ("--audit", "audit", [], True),
    ("--audit-trials", "audit_trials", ["5"], 5),
    ("--audit-demo-sets", "audit_demo_sets", ["2"], 2),
    ("--audit-members", "audit_members", ["30"], 30),
    ("--audit-mode", "audit_mode", ["regenerate"], "regenerate"),
    ("--audit-holdout", "audit_holdout", ["0.2"], 0.2),
    ("--audit-test", "audit_test", ["equivalence"], "equivalence"),
    ("--leak-auc", "leak_auc", ["0.8"], 0.8),
    ("--audit-power", "audit_power", ["0.9"], 0.9),
    ("--audit-reference", "audit_reference", [], True),
    ("--audit-methods", "audit_methods", [], True),
    ("--audit-reference-prompts", "audit_reference_prompts", ["2"], 2),
    ("--audit-max-record-tokens", "audit_max_record_tokens", ["12"], 12),
    ("--auc-tolerance", "auc_tolerance", ["0.1"], 0.1),
    ("--overlap-threshold", "overlap_threshold", ["6"], 6),
    ("--pate-preset", "pate_preset", ["cpu"], "cpu"),
    ("--pate-teachers", "pate_teachers", ["8"], 8),
    ("--pate-shots", "pate_shots", ["2"], 2),
    ("--pate-public", "pate_public", ["ood"], "ood"),
    ("--pate-public-path", "pate_public_path", ["public.csv"], "public.csv"),
    ("--pate-public-column", "pate_public_column", ["body"], "body"),
    ("--pate-queries", "pate_queries", ["40"], 40),
    ("--pate-threshold", "pate_threshold", ["7"], 7.0),
    ("--pate-sigma1", "pate_sigma1", ["4"], 4.0),
    ("--pate-sigma2", "pate_sigma2", ["6"], 6.0),
    ("--pate-vote-mode", "pate_vote_mode", ["black-box"], "black-box"),
    ("--pate-target-epsilon", "pate_target_epsilon", ["2"], 2.0),
    ("--pate-accounting", "pate_accounting", ["data-dependent"], "data-dependent"),
    ("--pate-gnss-order", "pate_gnss_order", ["8"], 8.0),
    ("--pate-gnss-beta", "pate_gnss_beta", ["0.05"], 0.05),
    ("--pate-gnss-sigma", "pate_gnss_sigma", ["12"], 12.0),
    ("--pate-gnss-delta0", "pate_gnss_delta0", ["1e-6"], 1e-6),
    ("--pate-repeats", "pate_repeats", ["2"], 2),
    ("--pate-student-candidates", "pate_student_candidates", ["4"], 4),
    ("--pate-baselines", "pate_baselines", ["zero-shot,ensemble"], ["zero-shot", "ensemble"]),
    ("--pate-teacher-block", "pate_teacher_block", ["10"], 10),
    ("--dpsgd-kind", "dpsgd_kind", ["prefix"], "prefix"),
    ("--dpsgd-preset", "dpsgd_preset", ["gpu"], "gpu"),
    ("--dpsgd-length", "dpsgd_length", ["5"], 5),
    ("--dpsgd-rank", "dpsgd_rank", ["4"], 4),
    ("--dpsgd-init", "dpsgd_init", ["random"], "random"),
    ("--dpsgd-clip", "dpsgd_clip", ["0.5"], 0.5),
    ("--dpsgd-batch-size", "dpsgd_batch_size", ["32"], 32),
    ("--dpsgd-epochs", "dpsgd_epochs", ["2.5"], 2.5),
    ("--dpsgd-steps", "dpsgd_steps", ["10"], 10),
    ("--dpsgd-lr", "dpsgd_lr", ["0.01"], 0.01),
    ("--dpsgd-physical-batch-size", "dpsgd_physical_batch_size", ["8"], 8),
    ("--dpsgd-validation-size", "dpsgd_validation_size", ["16"], 16),
    ("--dpsgd-validation-path", "dpsgd_validation_path", ["validation.csv"], "validation.csv"),
    ("--dpsgd-seeds", "dpsgd_seeds", ["2"], 2),
    ("--adadpsyn-sigma-radius", "adadpsyn_sigma_radius", ["10"], 10.0),
    ("--adadpsyn-sigma-test", "adadpsyn_sigma_test", ["4"], 4.0),
    ("--adadpsyn-tolerance", "adadpsyn_tolerance", ["0.2"], 0.2),
    ("--adadpsyn-coverage", "adadpsyn_coverage", ["0.7"], 0.7),
    ("--adadpsyn-shrink", "adadpsyn_shrink", ["0.5"], 0.5),
    ("--adadpsyn-test-fraction", "adadpsyn_test_fraction", ["0.6"], 0.6),
    ("--adadpsyn-updates", "adadpsyn_updates", ["3"], 3),
    ("--dp-opt-preset", "dp_opt_preset", ["cpu"], "cpu"),
    ("--dp-opt-subsets", "dp_opt_subsets", ["4"], 4),
    ("--dp-opt-shots", "dp_opt_shots", ["3"], 3),
    ("--dp-opt-max-tokens", "dp_opt_max_tokens", ["8"], 8),
    ("--dp-opt-candidates", "dp_opt_candidates", ["2"], 2),
    ("--dp-opt-temperature", "dp_opt_temperature", ["0.9"], 0.9),
    ("--dp-icl-subsets", "dp_icl_subsets", ["6"], 6),
    ("--dp-icl-shots", "dp_icl_shots", ["2"], 2),
    ("--dp-icl-queries-per-draw", "dp_icl_queries_per_draw", ["5"], 5),
    ("--dp-icl-vote-mode", "dp_icl_vote_mode", ["black-box"], "black-box"),
    ("--dp-icl-max-keywords", "dp_icl_max_keywords", ["3"], 3),
    ("--task-runner", "task_runner", ["threads:2"], "threads:2"),
]
# The other spelling of a switch (`--rvp` is kept, hidden, for the default).
NEGATIONS = {"--no-new-budget-for-same-records": "new_budget_for_same_records", "--rvp": "rvp",
             "--no-calibrate": "calibrate", "--no-audit": "audit", "--no-audit-reference": "audit_reference",
             "--no-audit-methods": "audit_methods"}
# The short spellings of `dpicl pate` and `dpicl tune`, beside the long ones.
PATE_ALIASES = {"--teachers": "pate_teachers", "--shots": "pate_shots", "--public-path": "pate_public_path",
                "--queries": "pate_queries", "--threshold": "pate_threshold", "--sigma1": "pate_sigma1",
                "--sigma2": "pate_sigma2", "--vote-mode": "pate_vote_mode", "--repeats": "pate_repeats",
                "--student-candidates": "pate_student_candidates", "--baselines": "pate_baselines",
                "--preset": "pate_preset", "--accounting": "pate_accounting", "--gnss-order": "pate_gnss_order",
                "--gnss-beta": "pate_gnss_beta", "--gnss-sigma": "pate_gnss_sigma", "--gnss-delta0": "pate_gnss_delta0"}
TUNE_ALIASES = {"--kind": "dpsgd_kind", "--length": "dpsgd_length", "--rank": "dpsgd_rank", "--clip": "dpsgd_clip",
                "--batch-size": "dpsgd_batch_size", "--epochs": "dpsgd_epochs", "--steps": "dpsgd_steps",
                "--lr": "dpsgd_lr", "--init": "dpsgd_init", "--seeds": "dpsgd_seeds", "--preset": "dpsgd_preset",
                "--validation-size": "dpsgd_validation_size",
                "--physical-batch-size": "dpsgd_physical_batch_size",
                "--validation-path": "dpsgd_validation_path"}

# A run's configuration as a run folder stored it before the sections (manifest.json, `model_dump`): flat.
OLD_STORED = json.loads("""{"adadpsyn_coverage": 0.7, "adadpsyn_shrink": 0.25, "adadpsyn_sigma_radius": 15.0,
"adadpsyn_sigma_test": 5.0, "adadpsyn_test_fraction": 0.55, "adadpsyn_tolerance": 0.1, "adadpsyn_updates": 2,
"auc_tolerance": 0.05, "audit": false, "audit_demo_sets": 1, "audit_max_record_tokens": null, "audit_members": 30,
"audit_methods": true, "audit_mode": null, "audit_power": 0.95, "audit_reference": false,
"audit_reference_prompts": 0, "audit_test": "detect", "audit_trials": 20, "baselines": ["zero-shot"],
"calibrate": true, "data_path": null, "dataset": "agnews", "dataset_id": null, "delta": null, "device": "auto",
"dp_icl_max_keywords": null, "dp_icl_queries_per_draw": null, "dp_icl_shots": null, "dp_icl_subsets": 6,
"dp_icl_vote_mode": null,
"dp_opt_candidates": null, "dp_opt_max_tokens": null, "dp_opt_preset": "auto", "dp_opt_shots": null,
"dp_opt_subsets": null, "dp_opt_temperature": null, "dpsgd_batch_size": null, "dpsgd_clip": null,
"dpsgd_epochs": null, "dpsgd_init": null, "dpsgd_kind": "soft-prompt", "dpsgd_length": null, "dpsgd_lr": null,
"dpsgd_physical_batch_size": null, "dpsgd_preset": "auto", "dpsgd_rank": null, "dpsgd_seeds": 1,
"dpsgd_steps": 48, "dpsgd_validation_path": null, "dpsgd_validation_size": null, "dtype": "auto",
"epsilons": [1.0, 4.0], "leak_auc": 0.75, "max_record_tokens": null, "max_tokens": 20, "mechanism": "gaussian",
"methods": ["tang", "pate"], "model": "smollm2-135m", "new_budget_for_same_records": false, "num_subsets": 5,
"overlap_threshold": 8, "pate_accounting": "data-independent", "pate_baselines": ["zero-shot"],
"pate_gnss_beta": null, "pate_gnss_delta0": null, "pate_gnss_order": null, "pate_gnss_sigma": 10.0,
"pate_preset": "auto", "pate_public": "iid", "pate_public_column": "text", "pate_public_path": null,
"pate_queries": null, "pate_repeats": 3, "pate_shots": 1, "pate_sigma1": null, "pate_sigma2": null,
"pate_student_candidates": null, "pate_target_epsilon": null, "pate_teacher_block": 25, "pate_teachers": 8,
"pate_threshold": null, "pate_vote_mode": "calibrated", "rvp": true, "sampler": "poisson", "seed": null,
"seeds": 2, "shots": 4, "subset_size": 1, "task_runner": "threads", "task_spec": null, "test_path": null,
"test_size": null, "top_k": 100}""")

# Settings added after OLD_STORED was written, with their defaults.
SINCE_STORED = {"audit_holdout": 0.1}


def _option_strings(subcommand: str) -> dict[str, str]:
    """{flag: its field's flat name} of a subcommand's flags built from RunConfig."""
    import argparse

    from flows.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = set(RunConfig.flat_names())
    return {option: action.dest for action in subparsers.choices[subcommand]._actions
            for option in action.option_strings if action.dest in names}


def test_each_section_is_declared_in_its_subsystem_and_holds_the_flat_names_of_its_prefix():
    assert SECTIONS == {"audit": AuditSection, "pate": PateSection, "dpsgd": DpsgdSection,
                        "adadpsyn": AdaDPSynSection, "dp_opt": DpOptSection, "dp_icl": DpIclSection}
    for name, section in SECTIONS.items():
        assert section.__module__ == f"dpcore.{name}.config"
        for field in section.model_fields:
            flat = section.flat_name(field)
            assert flat.startswith(section.PREFIX) or name == "audit", flat
            assert RunConfig.flat_field(flat) is section.model_fields[field]
    assert [flat for _, flat, _, _ in RUN_FLAGS] == list(RunConfig.flat_names())  # every field, in order


def test_the_flat_and_the_nested_spellings_give_equal_configs():
    flat = RunConfig(pate_teachers=8, pate_baselines="zero-shot,ensemble", dpsgd_steps=10, audit=False,
                     audit_trials=5, leak_auc=0.8, adadpsyn_coverage=0.7, dp_opt_subsets=4, dp_icl_shots=2)
    nested = RunConfig(pate={"teachers": 8, "baselines": ["zero-shot", "ensemble"]}, dpsgd=DpsgdSection(steps=10),
                       audit={"enabled": False, "trials": 5, "leak_auc": 0.8}, adadpsyn={"coverage": 0.7},
                       dp_opt={"subsets": 4}, dp_icl={"shots": 2})
    both = RunConfig(pate={"teachers": 8}, pate_baselines=["zero-shot", "ensemble"], dpsgd_steps=10,
                     audit={"trials": 5, "enabled": False}, leak_auc=0.8, adadpsyn_coverage=0.7, dp_opt_subsets=4,
                     dp_icl={"shots": 2})
    assert flat == nested == both
    assert flat.pate.teachers == 8 and flat.dpsgd.steps == 10 and flat.audit.enabled is False
    assert flat.audit.leak_auc == 0.8 and flat.value("leak_auc") == 0.8 and flat.value("pate_teachers") == 8
    assert flat.flat_fields_set == nested.flat_fields_set == {
        "pate_teachers", "pate_baselines", "dpsgd_steps", "audit", "audit_trials", "leak_auc", "adadpsyn_coverage",
        "dp_opt_subsets", "dp_icl_shots"}
    # a section given as a model, and a field of it flat beside it
    mixed = RunConfig(pate=PateSection(teachers=8), pate_shots=2)
    assert mixed.pate == PateSection(teachers=8, shots=2)
    with pytest.raises(ValidationError, match="given twice"):
        RunConfig(pate={"teachers": 8}, pate_teachers=9)
    # the audit switch, flat or nested, is never the section's truth value
    with pytest.raises(TypeError, match="audit.enabled"):
        bool(RunConfig().audit)


def test_an_unknown_key_is_an_error_naming_it():
    with pytest.raises(ValidationError, match="pate_bogus"):
        RunConfig(pate_bogus=1)
    with pytest.raises(ValidationError, match="bogus"):
        RunConfig(pate={"bogus": 1})
    with pytest.raises(Exception, match="pate_bogus"):
        RunConfig().with_updates(pate_bogus=1)
    assert flag("pate_teachers") == "--pate-teachers (pate_teachers)" == PateSection.flag("teachers")
    assert flag("pate_public", "ood") == "--pate-public ood (pate_public: ood)"
    assert flag("audit") == "--audit (audit)" and flag("leak_auc") == "--leak-auc (leak_auc)"
    assert flag("rvp") == "--no-rvp (rvp)" and flag("not_a_field") == "not_a_field"


def test_a_stored_config_of_the_flat_form_loads_and_is_dumped_as_it_was():
    config = RunConfig(**OLD_STORED)
    assert config.pate.teachers == 8 and config.audit.enabled is False and config.audit.members == 30
    assert config.dpsgd.steps == 48 and config.dp_icl.subsets == 6 and config.adadpsyn.coverage == 0.7
    assert config.methods == ["tang", "pate"] and config.epsilons == [1.0, 4.0]
    # a run folder's config reads as ever; a setting added since takes its default
    assert json.loads(config.model_dump_json()) == {**OLD_STORED, **SINCE_STORED}
    assert RunConfig.model_validate_json(config.model_dump_json()) == config
    assert list(config.model_dump()) == list(RunConfig.flat_names())


def test_flat_round_trips():
    for config in (RunConfig(), RunConfig(**OLD_STORED),
                   RunConfig(pate_public_path="public.csv", epsilons=[1.0, math.inf], delta=1e-5, seed=3,
                             audit_mode="regenerate", dpsgd_init="random", dp_icl_vote_mode="black-box")):
        flat = config.flat()
        assert all(isinstance(v, str) for v in flat.values()) and list(flat) == list(RunConfig.flat_names())
        assert RunConfig(**flat) == config
        assert RunConfig(**config.model_dump()) == config
    assert RunConfig().flat()["pate_teachers"] == "None" and RunConfig().flat()["audit"] == "True"
    assert RunConfig(pate_baselines=["zero-shot", "ensemble"]).flat()["pate_baselines"] == "zero-shot,ensemble"


def test_updates_by_flat_name_keep_working():
    config = RunConfig(pate_teachers=8)
    updated = config.with_updates(pate_baselines=["ensemble"], audit=False, delta=1e-5)
    assert updated.pate.baselines == ["ensemble"] and updated.pate.teachers == 8 and updated.delta == 1e-5
    assert updated.audit.enabled is False and config.audit.enabled is True and config.pate.baselines == ["zero-shot"]
    assert {"pate_baselines", "audit", "delta", "pate_teachers"} <= updated.flat_fields_set
    # model_copy(update=...) takes flat names too (it routes through with_updates)
    copied = config.model_copy(update={"pate_target_epsilon": 2.0, "epsilons": [1.0], "audit_trials": 3})
    assert copied.pate.target_epsilon == 2.0 and copied.epsilons == [1.0] and copied.audit.trials == 3
    assert copied.model_copy(update={"pate": PateSection(shots=3)}).pate == PateSection(shots=3)


def test_audit_config_is_the_sections_view():
    config = RunConfig(audit_trials=5, audit_members=30, leak_auc=0.8, audit_max_record_tokens=12, test_path="t.csv")
    audit = config.audit_config()
    assert audit == AuditConfig(enabled=True, trials=5, demo_sets=1, members=30, non_members=30, leak_auc=0.8,
                                max_record_tokens=12, mode="run-demos", held_out="holdout")
    assert RunConfig(audit_mode="regenerate", test_path="t.csv").audit_config().mode == "regenerate"


def test_every_flag_of_today_parses_to_the_same_value():
    from flows.cli import build_parser
    from flows.cli.common import checked_config

    run = _option_strings("run")
    assert run == {**{option: name for option, name, _, _ in RUN_FLAGS}, **NEGATIONS}
    assert list(dict.fromkeys(d for f, d in run.items())) == [dest for _, dest, _, _ in RUN_FLAGS]
    pate, tune = _option_strings("pate"), _option_strings("tune")
    assert all(pate[alias] == name and pate["--" + name.replace("_", "-")] == name for alias, name in PATE_ALIASES.items())
    assert all(tune[alias] == name and tune["--" + name.replace("_", "-")] == name for alias, name in TUNE_ALIASES.items())

    parser = build_parser()
    for option, name, values, expected in RUN_FLAGS:
        config = checked_config(parser.parse_args(["run", option, *values]))
        assert config.value(name) == expected, option
        assert RunConfig(**config.flat()) == config, option
    assert checked_config(parser.parse_args(["run", "--no-audit"])).audit.enabled is False
    assert checked_config(parser.parse_args(["run", "--no-audit-methods"])).audit.methods is False
    assert checked_config(parser.parse_args(["run", "--pate-public-path", "p.csv"])).pate.public == "file"
    pated = checked_config(parser.parse_args(["pate", "--teachers", "9", "--sigma2", "3", "--epsilon", "2"]))
    assert (pated.pate.teachers, pated.pate.sigma2) == (9, 3.0)


def test_a_sections_bad_value_names_its_flag(cli):
    code, _, err = cli(["run", "--pate-teachers", "0", "--json"])
    assert code != 0 and "--pate-teachers (pate_teachers)" in err and "pate.teachers" not in err
    code, _, err = cli(["run", "--audit-power", "2", "--json"])
    assert code != 0 and "--audit-power (audit_power)" in err
    code, _, err = cli(["run", "--leak-auc", "0.2", "--json"])
    assert code != 0 and "--leak-auc (leak_auc)" in err
    code, _, err = cli(["run", "--pate-public", "iid", "--pate-public-path", "p.csv", "--json"])
    assert code != 0 and "--pate-public-path (pate_public_path) is a public file" in err


def test_prefect_yaml_deployments_still_validate():
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    from flows.pipeline import private_prompting_pipeline
    from flows.regenerate import regenerate

    flows = {"flows/pipeline.py:private_prompting_pipeline": private_prompting_pipeline,
             "flows/regenerate.py:regenerate": regenerate}
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    checked = 0
    for deployment in deployments:
        config = (deployment.get("parameters") or {}).get("config")
        if config is None:
            continue
        parsed = RunConfig(**config)  # the flat keys fold into the sections
        assert parsed.audit.enabled is config.get("audit", True)
        schema = parameter_schema(flows[deployment["entrypoint"]].fn).model_dump_for_openapi()
        assert validate({"config": config}, schema) == [], deployment["name"]  # Prefect's enforced schema
        assert validate({"config": json.loads(parsed.model_dump_json())}, schema) == [], deployment["name"]
        checked += 1
    assert checked >= 3
    # the schema is the flat form: a deployment's keys are the flags' names
    schema = parameter_schema(private_prompting_pipeline.fn).model_dump_for_openapi()
    properties = schema["definitions"]["RunConfig"]["properties"]
    assert list(properties) == list(RunConfig.flat_names())
    assert properties["pate_teachers"]["description"] == PateSection.model_fields["teachers"].description
