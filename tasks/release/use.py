"""Using a release (post-processing of a DP release: no privacy cost): `dpicl predict` (answers on a local
model or through an OpenAI-compatible endpoint) and `dpicl export` (the release as a plain prompt template), each
by what its method's release is (`ReleaseSpec.kind`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dpcore.errors import ConfigError
from dpcore.release.spec import UNNAMED_METHOD
from tasks.common import language_model
from tasks.release.check import release_spec
from tasks.release.registry import load_release


def answer_queries(release: str, dataset_id: str | None, texts: list[str], *, model: str | None = None,
                   device: str = "auto", calibrate: bool | None = None, endpoint=None) -> tuple[dict, str, list[dict]]:
    """`dpicl predict`: ICL answers to `texts` with a release's demos (or its trained prompt) only, post-processing
    of a DP release (no privacy cost): (the release manifest, the model's name, one answer per text).

    `calibrate` None: the method's scoring (`dpcore.release.predict.default_calibration`).

    `endpoint` (a `dpcore.release.endpoint.EndpointConfig`): answer through that OpenAI-compatible server instead of a
    local model (`model` is then the served model's name); a PromptDPSGD release is refused (local only)."""
    from dpcore.data.taskspec import TaskSpec
    from dpcore.release import predict

    manifest = load_release(release, dataset_id)
    released = release_spec(manifest.get("method", UNNAMED_METHOD))
    spec = TaskSpec.model_validate(manifest["task_spec"])
    demos = [(d["text"], d["label"]) for d in manifest["demos"]]
    if calibrate is None:
        calibrate = predict.default_calibration(manifest.get("method"))
    if endpoint is not None:
        from dpcore.release import endpoint as remote
        from dpcore.release.export import local_only_reason

        reason = local_only_reason(manifest, "it cannot be sent to an endpoint", released)
        if reason:
            raise ConfigError(reason)
        config = endpoint if model is None else replace(endpoint, model=model)
        connection = remote.connect(config, known_model=manifest.get("model"))
        return manifest, connection.model, remote.answer(connection, spec, demos, texts, calibrate=calibrate)
    lm = language_model(model or manifest["model"], device=device)
    name, past = lm.name, None
    if released.applied_to_model is not None:
        lm, past = released.applied_to_model(lm, Path(manifest["release_dir"]) / manifest["artifact"]["file"],
                                             manifest["model_weights_sha256"], manifest["model"])
    return manifest, name, predict.answer(lm, spec, demos, texts, calibrate=calibrate, past=past)


def export_release(release: str, dataset_id: str | None, placeholder: str | None = None) -> tuple[dict, dict]:
    """`dpicl export`: (the release manifest, its prompt template and guarantee, `dpcore.release.export.export`);
    a PromptDPSGD release is refused (no text form)."""
    from dpcore.release import export

    manifest = load_release(release, dataset_id)
    released = release_spec(manifest.get("method", UNNAMED_METHOD))
    return manifest, export.export(manifest, released, placeholder or export.DEFAULT_PLACEHOLDER)
