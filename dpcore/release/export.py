"""A release as a plain prompt template any model can use (`dpicl export`; post-processing, no privacy cost).

The template is the prompt `dpcore.lm.icl.prompt_text` builds (the task's instruction, the released
demonstrations, the query in the task's format: Tang et al. Table 7/8) with a placeholder where the query's
text goes: replacing the placeholder by a text (a literal replacement, not `str.format`: demonstrations may
hold braces) gives, character for character, the prompt dpicl's own scorer reads. A classification model then
continues with `" " + verbalizer` of a label; an extraction task's answer is the text up to the next newline.

What the export holds is what the release itself holds (DP demonstrations, PromptPATE's student prompt or an
instruction in front of the prompt, its guarantee and the task's public format); a trained prompt's release
(a soft prompt or prefix: tensors in one local model's embedding space) has no text form and is refused. What
the release is comes from its method's `ReleaseSpec` (`dpcore.release.spec`), which the caller looks up.
"""

from __future__ import annotations

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError
from dpcore.lm import icl
from dpcore.release.spec import TEXT_KINDS, UNNAMED_METHOD, ReleaseSpec

DEFAULT_PLACEHOLDER = "{text}"


def release_name(manifest: dict) -> str:
    return f"release v{manifest.get('release_version')} of {manifest.get('dataset_id')}"


def local_only_reason(manifest: dict, what: str, release: ReleaseSpec) -> str | None:
    """Why `what` (an export, an endpoint) cannot use this release (of `release`'s method), or None: a trained
    prompt answers only on the local model it was trained on."""
    if release.kind in TEXT_KINDS:
        return None
    version = manifest.get("release_version")
    return (f"{release_name(manifest)} is a PromptDPSGD trained prompt (method {manifest.get('method')}): tensors "
            f"read inside the model it was trained on, not text, so {what}; it answers through `dpicl predict "
            f"--release {version} --dataset-id {manifest.get('dataset_id')}` on that local model "
            f"({manifest.get('model')})")


def prompt_template(spec: TaskSpec, demos, placeholder: str = DEFAULT_PLACEHOLDER) -> tuple[str, str, str]:
    """(template, the text before the placeholder, the text after it): `icl.prompt_text` with the placeholder
    as the query. A placeholder that is empty or already occurs in the prompt is refused (filling it would
    change the demonstrations)."""
    if not placeholder:
        raise ConfigError("--placeholder: must not be empty")
    prefix = icl.prefix_text(spec, demos)
    head, tail = spec.icl.query(placeholder).split(placeholder, 1)
    before, after = prefix + head, tail
    if placeholder in before or placeholder in after:
        raise ConfigError(f"--placeholder {placeholder!r}: the prompt itself holds that text; choose another "
                          "(for example --placeholder '<<QUERY>>')")
    return before + placeholder + after, before, after


def fill(template: str, text: str, placeholder: str = DEFAULT_PLACEHOLDER) -> str:
    """The prompt of one query: the placeholder replaced by `text` (literally)."""
    return template.replace(placeholder, text, 1)


def guarantee(manifest: dict, release: ReleaseSpec) -> dict:
    """The release's guarantee and provenance: epsilon, delta, method and the method's parameters at the top
    level (the rule of every `--json` of dpicl; `release.export_parameters` when it names them, as its manifest
    states them), the dataset id, release version, run, and model."""
    method = manifest.get("method", UNNAMED_METHOD)
    out = {"epsilon": manifest.get("epsilon"), "delta": manifest.get("delta"), "method": method}
    if release.export_parameters is not None:
        out.update({k: manifest.get(k) for k in release.export_parameters})
    else:
        parameters = dict(manifest.get("parameters") or {})
        out.update({k: v for k, v in parameters.items() if k not in out})
        out["parameters"] = parameters
        out["spends"] = list(manifest.get("spends") or [])
    out.update({"dataset_id": manifest.get("dataset_id"), "dataset": manifest.get("dataset"),
                "release_version": manifest.get("release_version"), "run_id": manifest.get("run_id"),
                "model": manifest.get("model"), "code_version": manifest.get("code_version"),
                "audit_passed": (manifest.get("audit") or {}).get("passed"),
                "assumptions": list(manifest.get("assumptions") or [])})
    sha = manifest.get("demos_sha256") or (manifest.get("artifact") or {}).get("sha256")
    out["demos_sha256"] = sha
    return out


def export(manifest: dict, release: ReleaseSpec, placeholder: str = DEFAULT_PLACEHOLDER) -> dict:
    """The export of a release manifest (`release.json`) of `release`'s method: its guarantee (`guarantee`) and
    the prompt template (`template`, `placeholder`, `prompt_prefix`, `prompt_suffix`), the task (`task`, `kind`, `labels`: label ->
    verbalizer, `answer_prefix`: what precedes a verbalizer in the answer, `stop`), the demonstrations
    (`demos`, `shots`) and how dpicl scores (`scoring`, `content_free_inputs`)."""
    reason = local_only_reason(manifest, "it cannot be exported as a text prompt", release)
    if reason:
        raise ConfigError(reason)
    spec = TaskSpec.model_validate(manifest["task_spec"])
    demos = [(str(d["text"]), str(d["label"])) for d in manifest.get("demos") or []]
    template, before, after = prompt_template(spec, demos, placeholder)
    classification = spec.kind == "classification"
    scoring = ("the label whose continuation (answer_prefix + verbalizer) has the highest log-probability after the "
               "prompt; with contextual calibration, each label's probability (normalised over the labels) divided by "
               "its mean probability for the content_free_inputs in the same template"
               if classification else "greedy text after the prompt, up to the first newline (exact match)")
    return {
        **guarantee(manifest, release),
        "template": template, "placeholder": placeholder, "prompt_prefix": before, "prompt_suffix": after,
        "task": spec.name, "kind": spec.kind, "labels": dict(spec.labels) if classification else {},
        "answer_prefix": " ", "stop": "\n",
        "demos": [{"text": t, "label": y} for t, y in demos], "shots": len(demos),
        **({"instruction": manifest["instruction"]} if manifest.get("instruction") is not None else {}),
        "scoring": scoring, "content_free_inputs": list(icl.CONTENT_FREE_INPUTS) if classification else [],
    }


def guarantee_line(manifest: dict) -> str:
    """One line for a terminal: what the export is, its guarantee and that using it costs nothing."""
    return (f"{release_name(manifest)}: method {manifest.get('method', UNNAMED_METHOD)}, epsilon "
            f"{manifest.get('epsilon')}, delta {manifest.get('delta')}, made with model {manifest.get('model')} (run "
            f"{manifest.get('run_id')}); post-processing of a DP release: no further privacy cost")
