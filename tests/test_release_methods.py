"""Audited releases of PromptPATE student prompts and PromptDPSGD trained prompts: the membership
audit of a fixed prompt (with a trained prompt's cache), the gate on the method's plan, `dpicl
predict --release` with the student prompt or the soft prompt in front, and the privacy boundary."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pipeline_support import home, mini_agnews, prefect_harness, share_tiny_model  # noqa: F401

from dpcore.audit import procedures as mia
from dpcore.audit.config import AuditConfig
from dpcore.dpsgd.release import RELEASE as DPSGD_RELEASE
from dpcore.errors import ConfigError, DataValidationError, ReleaseRefusedError
from dpcore.pate.release import PATE_PLAN_FILE, TEACHER_AUDIT_FILE
from dpcore.pate.release import RELEASE as PATE_RELEASE
from dpcore.release import gate
from tasks.methods import release_specs

pytestmark = pytest.mark.usefixtures("prefect_harness")

# Tiny trials on a random model: the release mechanics are under test here; the gate's AUC band is
# tested in test_audit_gate. The 30 records the flock read fill 15 independent trials of 2 members
# (`audit_statistics.independent_trials`), each against 6 held-out records; a wide band: these tests check
# the release path, not the audit's power. Sized so a prompt that leaks nothing concludes (passes) all but
# once in 10^4 (`test_the_tiny_audit_concludes_when_nothing_leaks`), and seeded as `dpicl release --seed`
# seeds it, so a rerun on the same pools draws the same trials. Each record's first 8 tokens only: the
# scoring is a pass of the tiny model's 49k-word head per token (measured: this file took 130 s of CPU in
# one process with whole records, 79 s with 8 tokens).
# the band nearly [0, 1] (equivalence): these tests check the release path, which needs a pass, not the gate
TINY_AUDIT = AuditConfig(trials=15, members=2, non_members=6, reference_prompts=2, auc_tolerance=0.49,
                         max_record_tokens=8, test="equivalence")
AUDIT_SEED = 11
AUC_FIELDS = ("auc", "auc_ci_low", "auc_ci_high", "pooled_auc", "auc_duan", "auc_label_calibrated",
              "auc_text_calibrated")


def _split(n_members: int = 30, n_non: int = 30):
    data_path, _, _, _ = mini_agnews()
    frame = pd.read_csv(data_path, dtype=str)
    return frame.iloc[:n_members].reset_index(drop=True), frame.iloc[-n_non:].reset_index(drop=True)


def _check_auc_fields(row: dict) -> None:
    for key in AUC_FIELDS:
        assert 0.0 <= float(row[key]) <= 1.0, key


def _private_twin(public: Path) -> Path:
    """The private store's copy of a public run file (the audit's figures live there)."""
    return home() / "private" / public.relative_to(home())


def _check_public_verdict_only(row: dict) -> None:
    assert row["verdict"] in ("passed", "inconclusive", "failed")
    assert not {key for key in row if key.startswith(("auc", "tpr", "epsilon_lower", "max_overlap", "pooled"))}


# --------------------------------------------------------------------------- the audit of a fixed prompt


def test_the_tiny_audit_concludes_when_nothing_leaks():
    """The release tests below expect `passed` from an audit of prompts that leak nothing: the design must
    conclude then with near certainty (`dpcore.audit.design`), on the smallest pools they audit (the 30
    records PromptPATE's flock read; a few hundred held-out records)."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    design = audit_design.plan(30, 90, members=TINY_AUDIT.members, non_members=TINY_AUDIT.non_members,
                               trials=TINY_AUDIT.trials, attacks=len(attacks_run(TINY_AUDIT.reference_prompts)),
                               confidence=TINY_AUDIT.confidence, tolerance=TINY_AUDIT.auc_tolerance,
                               test=TINY_AUDIT.test)
    assert design.independent_trials == TINY_AUDIT.trials and 1 - design.conclusive_probability < 1e-4


def test_prompt_audit_of_a_trained_prompt_scores_with_its_cache(tiny_lm, agnews_spec):
    import torch

    from dpcore.dpsgd.soft_prompt import init_prompt
    from dpcore.lm.icl import label_logprobs, normalise_probs

    members, non_members = _split()
    prompt = init_prompt(tiny_lm, "soft-prompt", 3, "vocab", torch.Generator().manual_seed(1))
    past = prompt.cache_layers(tiny_lm)
    config = AuditConfig(trials=4, members=5, non_members=5, reference_prompts=2)
    result = mia.prompt_audit(tiny_lm, agnews_spec, [], members, non_members, config, seed=3, setting="dp",
                              epsilon=8.0, noise_multiplier=0.5, delta=1e-3, crosscheck_agreed=True, past=past)
    _check_auc_fields(result.audit_frame().iloc[0].to_dict())
    scores = result.mia_scores
    assert set(scores.loc[scores["member"], "record_id"]) <= set(members["id"])
    assert set(scores.loc[~scores["member"], "record_id"]) <= set(non_members["id"])
    assert result.max_overlap_tokens == 0 and result.trials == 4
    # Duan's score is p(true label | trained prompt, x): icl.label_logprobs with the cache, normalised
    duan = scores[(scores["attack"] == "duan")].drop_duplicates("record_id").set_index("record_id")["score"]
    frame = pd.concat([members, non_members]).set_index("id").loc[duan.index]
    probs = normalise_probs(label_logprobs(tiny_lm, agnews_spec, [], frame["text"].tolist(), past=past))
    expected = probs[np.arange(len(frame)), [agnews_spec.label_names.index(y) for y in frame["label"]]]
    np.testing.assert_allclose(duan.to_numpy(), expected, atol=1e-4)
    # the prompt changes the scores: the cache is in front
    plain = normalise_probs(label_logprobs(tiny_lm, agnews_spec, [], frame["text"].tolist()))
    assert not np.allclose(plain[np.arange(len(frame)), [agnews_spec.label_names.index(y) for y in frame["label"]]],
                           expected, atol=1e-4)


def test_members_and_non_members_must_be_disjoint(tiny_lm, agnews_spec):
    members, non_members = _split()
    with pytest.raises(DataValidationError, match="both members and non-members"):
        mia.prompt_audit(tiny_lm, agnews_spec, [], members, pd.concat([non_members, members.head(1)]),
                         AuditConfig(trials=2, members=3, non_members=3), seed=0, setting="dp", epsilon=1.0,
                         noise_multiplier=1.0, delta=1e-3, crosscheck_agreed=True)


def test_teacher_audit_is_leaky_by_design_and_fails_its_gate(tiny_lm, agnews_spec):
    members, non_members = _split()
    teachers = [members.iloc[[i]].reset_index(drop=True) for i in range(8)]
    result = mia.teacher_audit(tiny_lm, agnews_spec, teachers, non_members,
                               AuditConfig(trials=6, members=1, non_members=8, reference_prompts=2), seed=1,
                               delta=1e-3)
    _check_auc_fields(result.audit_frame().iloc[0].to_dict())
    assert result.setting == "non-private" and result.trials == 6 and not result.passed
    assert any("not differentially private" in r for r in result.reasons)
    assert result.max_overlap_tokens >= 8  # the teachers' demos ARE the member records
    per_trial = result.mia_scores[result.mia_scores["member"]].groupby("trial")["record_id"].nunique()
    assert (per_trial == 1).all()  # one 1-shot teacher, one member per trial


# --------------------------------------------------------------------------- PromptPATE runs


def _pate_args(dataset_id: str, *extra: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    return ["pate", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--model", "tiny-random", "--epsilon", "inf", "--teachers", "30", "--queries", "12", "--threshold", "3",
            "--sigma1", "1", "--sigma2", "2", "--repeats", "1", "--test-size", "8", "--student-candidates", "3", "--public", "ood",
            "--dataset-id", dataset_id, "--json", *extra]


@pytest.fixture(scope="module")
def pate_run(tiny_lm):
    from flows.cli import main

    share_tiny_model(tiny_lm)
    assert main(_pate_args("release-pate")) == 0  # unseeded: cryptographic noise
    return _latest_pate_run("release-pate")


def _latest_pate_run(dataset_id: str) -> dict:
    """The newest PromptPATE run folder of `dataset_id` (its id, folder and plan)."""
    for path in sorted((home() / "runs").rglob(PATE_PLAN_FILE), key=lambda p: p.stat().st_mtime, reverse=True):
        plan = json.loads(path.read_text())
        if plan["dataset_id"] == dataset_id:
            return {"run_id": path.parent.name, "run_dir": path.parent, "plan": plan}
    raise AssertionError(f"no PromptPATE run of {dataset_id}")


def test_pate_student_prompt_is_audited_released_and_answers(pate_run, tiny_lm, capsys, tmp_path):
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main
    from flows.release import release

    run_id = pate_run["run_id"]
    before = [e.purpose for e in Ledger().entries("release-pate")]
    result = release(run_id=run_id, method="pate", audit_config=TINY_AUDIT, teacher_reference=True, seed=AUDIT_SEED)
    assert result["method"] == "pate" and result["artifact"].startswith("student-r")
    # the single-teacher contrast was charged as an infinite spend before it read a record
    after = Ledger().entries("release-pate")
    assert len(after) == len(before) + 1 and after[-1].noise_multiplier == 0.0 and after[-1].run_id == run_id
    teacher = result["teacher_reference"]
    assert teacher["setting"] == "non-private" and not teacher["passed"] and "auc" not in teacher
    for name in (PATE_RELEASE.audit_file, TEACHER_AUDIT_FILE):  # figures private, verdict public
        public = Path(pate_run["run_dir"]) / name
        _check_public_verdict_only(pd.read_parquet(public).iloc[-1].to_dict())
        _check_auc_fields(pd.read_parquet(_private_twin(public)).iloc[-1].to_dict())
    # the manifest names the method, its plan's spends and the audit verdict; the student prompt is public
    manifest = json.loads((Path(result["release_dir"]) / "release.json").read_text())
    assert manifest["method"] == "pate" and manifest["audit"]["passed"] is True
    assert [s["purpose"] for s in manifest["spends"]] == ["pate", "pate"]
    assert [(e["run_id"], e["purpose"], e["noise_multiplier"], e["steps"]) for e in manifest["ledger_entries"]] == [
        (run_id, "pate", s["noise_multiplier"], s["steps"]) for s in manifest["spends"]]
    assert manifest["epsilon"] == pate_run["plan"]["plan"]["epsilon"] and manifest["delta"] > 0
    students = pd.read_parquet(Path(pate_run["run_dir"]) / "pate_students.parquet")
    queries = set(pd.read_parquet(Path(pate_run["run_dir"]) / "pate_queries.parquet")["text"])
    assert {d["text"] for d in manifest["demos"]} <= queries and len(manifest["demos"]) == 1
    assert set(students["text"]) <= queries
    # a later audit of the same artifact under the same configuration is reused: not rerun, not charged again
    again = release(run_id=run_id, method="pate", audit_config=TINY_AUDIT, teacher_reference=True, audit_only=True,
                    seed=AUDIT_SEED)
    assert again["reused"] is True and again["audit"]["verdict"] == result["audit"]["verdict"] == "passed"
    assert again["teacher_reference"] == teacher
    assert len(Ledger().entries("release-pate")) == len(after)
    stored = pd.read_parquet(Path(pate_run["run_dir"]) / PATE_RELEASE.audit_file).iloc[-1]
    assert json.loads(stored["audit_config"])["seed"] == AUDIT_SEED  # another seed is another audit
    mia_scores = pd.read_parquet(next((home() / "private").rglob(f"*{run_id}/mia_scores_pate.parquet")))
    for _, group in mia_scores.groupby("artifact"):
        assert not set(group.loc[group["member"], "record_id"]) & set(group.loc[~group["member"], "record_id"])

    queries_path = tmp_path / "queries.jsonl"
    queries_path.write_text('{"id": "q1", "text": "Stocks rallied after the bank raised its outlook."}\n')
    out = tmp_path / "answers.jsonl"
    capsys.readouterr()
    assert main(["predict", "--release", "production", "--input", str(queries_path), "--out", str(out),
                 "--dataset-id", "release-pate"]) == 0
    answer = json.loads(out.read_text())
    assert answer["id"] == "q1" and answer["prediction"] in {"World", "Sports", "Business", "Technology"}
    assert "no further privacy cost" in capsys.readouterr().err


@pytest.fixture(scope="module")
def seeded_pate_run(tiny_lm):
    from flows.cli import main

    share_tiny_model(tiny_lm)
    assert main(_pate_args("release-pate-seeded", "--seed", "7")) == 0
    return _latest_pate_run("release-pate-seeded")


def test_a_seeded_pate_run_is_refused(seeded_pate_run):
    from dpcore.privacy.ledger import Ledger
    from flows.release import release

    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id=seeded_pate_run["run_id"], method="pate", audit_config=TINY_AUDIT, teacher_reference=True)
    assert "fixed seed" in str(info.value) and "no privacy-ledger entry" not in str(info.value)
    # refused before the audit and before the single-teacher contrast's infinite spend
    assert not (Path(seeded_pate_run["run_dir"]) / PATE_RELEASE.audit_file).exists()
    assert all(e.noise_multiplier > 0 for e in Ledger().entries("release-pate-seeded"))


def test_the_teacher_contrast_is_refused_over_budget_before_any_teacher_prompt(seeded_pate_run, capsys):
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    book = Ledger()
    book.set_budget("release-pate-seeded", 100.0, 1e-2)  # finite: the infinite spend of real records exceeds it
    before = len(book.entries("release-pate-seeded"))
    capsys.readouterr()
    code = main(["release", "--run", seeded_pate_run["run_id"], "--method", "pate", "--teacher-reference",
                 "--audit-only", "--trials", "40", "--audit-members", "5", "--audit-reference-prompts", "2"])
    assert code == 3 and "budget" in capsys.readouterr().err.lower()
    assert len(book.entries("release-pate-seeded")) == before
    assert not (Path(seeded_pate_run["run_dir"]) / TEACHER_AUDIT_FILE).exists()


def test_an_edited_audit_table_is_refused(pate_run):
    from dpcore.data.artifacts import write_table
    from dpcore.privacy.ledger import Ledger, Spend
    from flows.release import release

    copy = Path(pate_run["run_dir"]).parent / "pate-edited-audit"
    shutil.copytree(pate_run["run_dir"], copy)
    private = next((home() / "private").rglob(f"*/{pate_run['run_id']}"))
    shutil.copytree(private, private.parent / "pate-edited-audit")
    for spend in pate_run["plan"]["plan"]["spends"]:  # its plan charged to the copy's run id
        request = Spend.sampled_steps(spend["mechanism"], spend["noise_multiplier"], spend["sampling_rate"],
                                      spend["steps"], spend["purpose"], dataset_id="release-pate",
                                      content_hash=pate_run["plan"]["data_hash"], run_id="pate-edited-audit",
                                      delta=pate_run["plan"]["plan"]["delta"])
        Ledger().charge([request], replay_recorded=False)
    # Two trials cannot conclude within the default 0.05 band: an audit that did not pass, edited to pass below.
    strict = AuditConfig(test="equivalence", trials=2, members=2, non_members=2, reference_prompts=0)
    release(run_id="pate-edited-audit", method="pate", audit_config=strict, audit_only=True)
    assert PATE_RELEASE.audit_file in json.loads((copy / "manifest.json").read_text())["files"]
    audit = pd.read_parquet(copy / PATE_RELEASE.audit_file)
    assert not audit["passed"].iloc[-1]
    audit["passed"], audit["reasons"] = True, ""
    write_table(audit, copy / PATE_RELEASE.audit_file)
    with pytest.raises(ReleaseRefusedError, match="changed since the run finished: audit_pate.parquet"):
        release(run_id="pate-edited-audit", method="pate", audit_config=strict)


def test_a_pate_run_without_its_ledger_entries_is_refused(pate_run):
    from flows.release import release

    copy = Path(pate_run["run_dir"]).parent / "pate-unrecorded"
    shutil.copytree(pate_run["run_dir"], copy)
    private = next((home() / "private").rglob(f"*/{pate_run['run_id']}"))
    shutil.copytree(private, private.parent / "pate-unrecorded")
    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id="pate-unrecorded", method="pate", audit_config=TINY_AUDIT)
    message = str(info.value)
    assert "no privacy-ledger entry of run pate-unrecorded records the released pate prompt's spend" in message
    assert "fixed seed" not in message


# --------------------------------------------------------------------------- PromptDPSGD runs


def _tune_args(dataset_id: str, *extra: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    return ["tune", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--dataset-id", dataset_id, "--model", "tiny-random", "--kind", "soft-prompt", "--length", "2",
            "--steps", "3", "--batch-size", "16", "--validation-size", "20", "--test-size", "8", "--json", *extra]


def test_dpsgd_prompt_is_audited_released_and_answers_on_its_model_only(tiny_lm, capsys, tmp_path):
    from dpcore.lm.model import LanguageModel
    from flows.cli import main
    from flows.release import release

    share_tiny_model(tiny_lm)
    # 12 steps: the audit's members are the records the batches drew, enough of them for a conclusive audit
    assert main(_tune_args("release-dpsgd", "--epsilon", "8", "--steps", "12")) == 0
    run_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]
    result = release(run_id=run_id, method="dpsgd", audit_config=TINY_AUDIT, seed=AUDIT_SEED)
    assert result["method"] == "dpsgd" and result["artifact"] == "dpsgd-eps8-0" and result["epsilon"] == 8.0
    folder = Path(result["release_dir"])
    manifest = json.loads((folder / "release.json").read_text())
    assert manifest["method"] == "dpsgd" and manifest["audit"]["passed"] is True and manifest["demos"] == []
    from dpcore.dpsgd.soft_prompt import weights_hash

    assert manifest["model_weights_sha256"] == weights_hash(tiny_lm.model)
    assert manifest["spends"][0]["purpose"] == "dpsgd" and manifest["noise_multiplier"] > 0
    assert (folder / "prompt.safetensors").exists() and manifest["artifact"]["file"] == "prompt.safetensors"
    run_dir = next((home() / "runs").rglob(f"*/{run_id}"))
    _check_public_verdict_only(pd.read_parquet(run_dir / DPSGD_RELEASE.audit_file).iloc[-1].to_dict())
    _check_auc_fields(pd.read_parquet(_private_twin(run_dir / DPSGD_RELEASE.audit_file)).iloc[-1].to_dict())
    # members (the DP-SGD training records) and non-members (held-out test records) are disjoint
    scores = pd.read_parquet(next((home() / "private").rglob(f"*{run_id}/mia_scores_dpsgd.parquet")))
    members = set(scores.loc[scores["member"], "record_id"])
    assert members and not members & set(scores.loc[~scores["member"], "record_id"])
    # the members are records some Poisson batch drew (what the mechanism read), not every training record:
    # with all N training records as members the attack is diluted by the ~99% never read
    training = json.loads(next((home() / "private").rglob(f"*{run_id}/training/dpsgd-eps8-0.json")).read_text())
    records = pd.read_parquet(next((home() / "private").rglob(f"*{run_id}/records.parquet")))
    train_ids = set(records.loc[records["split"] == "train", "id"].astype(str))
    assert members <= set(training["sampled_ids"]) <= train_ids
    assert 0 < len(training["sampled_ids"]) < len(train_ids)

    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "The striker scored twice in the final."}\n')
    out = tmp_path / "answers.jsonl"
    assert main(["predict", "--release", "production", "--input", str(queries), "--out", str(out),
                 "--dataset-id", "release-dpsgd"]) == 0
    answer = json.loads(out.read_text())
    assert answer["prediction"] in {"World", "Sports", "Business", "Technology"}
    capsys.readouterr()
    # another model (other weights) is refused, naming the model the prompt was trained on
    other = tmp_path / "other-model"
    lm = LanguageModel.tiny_random(seed=1)
    lm.model.save_pretrained(other)
    lm.tokenizer.save_pretrained(other)
    assert main(["predict", "--release", "production", "--input", str(queries), "--dataset-id", "release-dpsgd",
                 "--model", str(other)]) == 2
    assert "only on the model it was trained on" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_fine_tuning_baseline_is_audited_released_and_answers_on_its_model_only(tiny_lm, capsys, tmp_path, kind):
    from dpcore.data.taskspec import TaskSpec
    from dpcore.dpsgd.adapters import adapted_lm
    from dpcore.dpsgd.soft_prompt import weights_hash
    from dpcore.lm import icl
    from dpcore.lm.model import LanguageModel
    from flows.cli import main
    from flows.release import release

    share_tiny_model(tiny_lm)
    dataset_id = f"release-{kind}"
    args = [a for a in _tune_args(dataset_id, "--epsilon", "8", "--steps", "12") if a not in ("--length", "2")]
    extra = ["--rank", "2"] if kind == "lora" else ["--physical-batch-size", "4"]
    assert main([*args[:args.index("--kind") + 1], kind, *args[args.index("--kind") + 2:], *extra]) == 0
    run_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]
    result = release(run_id=run_id, method="dpsgd", audit_config=TINY_AUDIT, seed=AUDIT_SEED)
    folder = Path(result["release_dir"])
    manifest = json.loads((folder / "release.json").read_text())
    assert manifest["method"] == "dpsgd" and manifest["audit"]["passed"] is True
    assert manifest["parameters"]["kind"] == kind and manifest["model_weights_sha256"] == weights_hash(tiny_lm.model)
    assert manifest["spends"][0]["purpose"] == "dpsgd" and manifest["noise_multiplier"] > 0
    assert json.loads((folder / "prompt.json").read_text())["kind"] == kind

    text = "The striker scored twice in the final."
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"text": text}) + "\n")
    out = tmp_path / "answers.jsonl"
    assert main(["predict", "--release", "production", "--input", str(queries), "--out", str(out),
                 "--dataset-id", dataset_id]) == 0
    answer = json.loads(out.read_text())
    # the answer is the adapted model's, scored as evaluation scored it (raw label likelihood)
    spec = TaskSpec.model_validate(manifest["task_spec"])
    scores = icl.label_logprobs(adapted_lm(tiny_lm, folder / "prompt.safetensors"), spec, [], [text])
    assert answer["prediction"] == spec.label_names[int(scores[0].argmax())]
    capsys.readouterr()
    other = tmp_path / "other-model"
    lm = LanguageModel.tiny_random(seed=1)
    lm.model.save_pretrained(other)
    lm.tokenizer.save_pretrained(other)
    assert main(["predict", "--release", "production", "--input", str(queries), "--dataset-id", dataset_id,
                 "--model", str(other)]) == 2
    assert "only on the model it was trained on" in capsys.readouterr().err


def test_a_non_private_soft_prompt_is_refused_by_the_gate(tiny_lm, capsys):
    """A soft prompt trained with sigma = 0 (epsilon inf) never passes the release gate, whatever its audit
    says: its plan has no finite guarantee for the accountants to agree on. So it is refused before the audit
    (no forward pass is spent on it); `--audit-only` still audits it, on the records its batches drew (not
    diluted by the records training never read)."""
    from flows.cli import main
    from flows.release import release

    share_tiny_model(tiny_lm)
    assert main(_tune_args("release-dpsgd-nonprivate", "--epsilon", "inf")) == 0
    run_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]
    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id=run_id, method="dpsgd", audit_config=TINY_AUDIT)
    assert "cross-check" in str(info.value) and "before its membership audit" in str(info.value)
    assert not list((home() / "private").rglob(f"*{run_id}/mia_scores_dpsgd.parquet"))
    release(run_id=run_id, method="dpsgd", audit_config=TINY_AUDIT, audit_only=True)
    training = json.loads(next((home() / "private").rglob(f"*{run_id}/training/dpsgd-epsinf-0.json")).read_text())
    scores = pd.read_parquet(next((home() / "private").rglob(f"*{run_id}/mia_scores_dpsgd.parquet")))
    assert set(scores.loc[scores["member"], "record_id"]) <= set(training["sampled_ids"])


def test_a_seeded_dpsgd_run_is_refused(tiny_lm, capsys):
    from flows.cli import main
    from flows.release import release

    share_tiny_model(tiny_lm)
    assert main(_tune_args("release-dpsgd-seeded", "--epsilon", "8", "--seed", "3")) == 0
    run_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]
    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id=run_id, method="dpsgd", audit_config=TINY_AUDIT)
    assert "fixed seed" in str(info.value) and "no privacy-ledger entry" not in str(info.value)
    assert "before its membership audit" in str(info.value)  # refused whatever it would find: not run
    assert not list((home() / "private").rglob(f"*{run_id}/mia_scores_dpsgd.parquet"))


def test_bad_release_requests_are_named(pate_run):
    from flows.release import release

    with pytest.raises(ConfigError, match="not a PromptDPSGD run"):
        release(run_id=pate_run["run_id"], method="dpsgd", audit_config=TINY_AUDIT)
    with pytest.raises(ConfigError, match="--repeat 5"):
        release(run_id=pate_run["run_id"], method="pate", repeat=5, audit_config=TINY_AUDIT)
    with pytest.raises(ConfigError, match=r"--audit-members \(audit_members\): 500 members per trial are more than the "
                                          r"records the prompt's mechanism read"):
        release(run_id=pate_run["run_id"], method="pate", audit_config=AuditConfig(members=500, non_members=5))


# --------------------------------------------------------------------------- privacy boundary


def test_no_private_text_or_ids_in_public_files_after_the_releases(pate_run):
    from test_privacy_boundary import (
        _file_text,
        _id_leaks,
        _leaks,
        _needles,
        _per_record_problems,
        _scanned_files,
    )

    root = home()
    files = _scanned_files(root)
    public_audits = [p for p in files if p.name in (*(s.audit_file for s in release_specs() if s.audit_file), TEACHER_AUDIT_FILE,
                                                    PATE_PLAN_FILE, "release.json")]
    assert {p.name for p in public_audits} >= {PATE_RELEASE.audit_file, TEACHER_AUDIT_FILE,
                                               PATE_PLAN_FILE, "release.json"}
    needles = _needles()
    assert {str(p): found for p in files if (found := _leaks(_file_text(p), needles))} == {}
    records = pd.concat([pd.read_parquet(p) for p in (root / "private").rglob("records.parquet")])
    ids = set(records["id"].astype(str))
    assert {str(p): found for p in public_audits if (found := _id_leaks(_file_text(p), ids))} == {}
    assert {str(p): found for p in public_audits if (found := _per_record_problems(p))} == {}


# --------------------------------------------------------------------------- the gate on a method's plan


def _pate_artifact(run_id: str, **change) -> gate.Artifact:
    from dpcore.pate.privacy import pate_plan

    plan = pate_plan(epsilon_target=None, delta=1e-3, queries=24, threshold_sigma=1.0, vote_sigma=2.0, teachers=16,
                     threshold=10).to_dict()
    values = dict(method="pate", run_id=run_id, path=Path("."), name="student-r0", epsilon=plan["epsilon"],
                  delta=plan["delta"], spends=tuple(plan["spends"]), seeded_noise=False,
                  info={"dataset_id": "gate-units"}, demos=(("a public query", "World"),), spec=PATE_RELEASE)
    values.update(change)
    return gate.Artifact(**values)


PASSING_AUDIT = pd.DataFrame([{"artifact": "student-r0", "passed": True, "reasons": ""}])


def _evidence(artifact: gate.Artifact, audit: pd.DataFrame, entries) -> gate.ReleaseEvidence:
    """The one gate's evidence for `artifact` with `audit` as its public audit table."""
    return gate.evidence(dataclasses.replace(artifact, audit=audit), entries)


def test_every_spend_of_the_plan_must_be_charged_to_the_run():
    from dpcore.privacy.ledger import Ledger, Spend

    artifact = _pate_artifact("gate-units-run")
    threshold, votes = artifact.spends
    book = Ledger()
    bound = dict(dataset_id="gate-units", content_hash="h", run_id="gate-units-run", delta=artifact.delta)
    threshold_spend = Spend.sampled_steps("gaussian", threshold["noise_multiplier"], 1.0, threshold["steps"],
                                          "pate", **bound)
    book.charge([threshold_spend], replay_recorded=False)
    evidence = _evidence(artifact, PASSING_AUDIT, book.entries_for_run("gate-units-run"))
    assert not evidence.ledger_entry_present  # the GNMax spend is missing
    assert any("no privacy-ledger entry" in f for f in gate.release_failures(evidence))
    votes_spend = Spend.sampled_steps("gaussian", votes["noise_multiplier"], 1.0, votes["steps"], "pate",
                                      **bound)
    book.charge([votes_spend], replay_recorded=False)
    evidence = _evidence(artifact, PASSING_AUDIT, book.entries_for_run("gate-units-run"))
    assert evidence.ledger_entry_present and evidence.crosscheck_agreed
    assert gate.release_failures(evidence) == []
    # the same spends under another purpose (an audit, a baseline) do not cover the release
    other = _evidence(_pate_artifact("gate-units-run", spends=tuple({**s, "purpose": "dpsgd"}
                                                                                for s in artifact.spends)),
                                   PASSING_AUDIT, book.entries_for_run("gate-units-run"))
    assert not other.ledger_entry_present


def test_an_audit_of_another_artifact_or_a_failed_one_does_not_pass_the_gate():
    artifact = _pate_artifact("gate-units-audit")
    other = _evidence(artifact, PASSING_AUDIT.assign(artifact="student-r1"), [])
    assert not other.audit_ran
    failed = _evidence(artifact, PASSING_AUDIT.assign(passed=False, reasons="AUC 0.8 outside"), [])
    assert any("audit failed: AUC 0.8" in f for f in gate.release_failures(failed))
    empty = _evidence(_pate_artifact("gate-units-audit", demos=()), PASSING_AUDIT, [])
    assert any("no PromptPATE student prompt" in f for f in gate.release_failures(empty))


def test_a_non_private_trained_prompt_is_refused():
    spend = {"mechanism": "gaussian", "noise_multiplier": 0.0, "sampling_rate": 0.3, "steps": 10, "purpose": "dpsgd"}
    artifact = gate.Artifact(method="dpsgd", run_id="gate-units-inf", path=Path("."), name="dpsgd-epsinf-0",
                             epsilon=float("inf"), delta=1e-3, spends=(spend,), seeded_noise=False,
                             info={}, prompt_path=Path(__file__))
    failures = gate.release_failures(_evidence(
        artifact, PASSING_AUDIT.assign(artifact="dpsgd-epsinf-0"), []))
    assert any("epsilon = inf" in f for f in failures) and any("cross-check" in f for f in failures)


@pytest.mark.parametrize("flags, needle", [
    (["--audit-only"], "apply to --method pate or dpsgd"),
    (["--method", "dpsgd", "--teacher-reference"], "PromptPATE's (--method pate)"),
    (["--method", "pate", "--trials", "0"], "audit flags"),
])
def test_bad_release_flags_are_named(cli, flags, needle):
    code, _, err = cli(["release", "--run", "any-run", *flags])
    assert code == 2 and needle in err
