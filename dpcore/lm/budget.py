"""The public token cap on private records, and the context budget of a group prompt.

A group prompt PB(instruction, records, y) + the text generated so far must fit the model's
context. Without a bound, one long private record makes a prompt overflow in the middle of a
run, after the privacy charge, and the failure itself depends on private data. So:

- Every record entering generation is cut to at most `max_record_tokens` tokens of the
  model's tokenizer (`truncate_records`). This is a per-record transformation applied to the
  dataset before sampling: the mechanism runs on the truncated dataset, whose add/remove
  neighbours are again one record apart, so the sensitivity and the accounting are unchanged.
- `prompt_budget` checks, before any privacy is spent and from public inputs only (the task's
  prompt template, the label names, the configuration and the model's context length), that
  the instruction + N records at the cap + the label line + T_max generated tokens fit.
  `max_record_tokens=None` derives the largest cap that fits; a cap that does not fit, or
  settings that leave no room for any record, raise a ConfigError naming the parameter.
- Poisson groups can hold more than N records. `fit_group` drops a group's last records
  (in its random order) until its prompt fits the context less T_max: a function of that
  group's own records only, so one record still changes at most one group's distribution.

Nothing here logs or raises with a record's text or length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.lm.models import resolve_model, tiny_tokenizer_folder

# Tokens allowed per record for merges across its boundaries inside a prompt (a record's
# tokens in context can differ from its tokens alone at the first and last position).
BOUNDARY_SLACK = 2


@dataclass(frozen=True)
class PromptBudget:
    """Public token arithmetic of the longest regular group prompt (all counts are tokens)."""

    context: int              # the model's positions (0: unknown, no limit)
    static_tokens: int        # instruction + the longest label's query line
    max_tokens: int           # T_max: generated tokens appended to every prompt
    per_record_overhead: int  # the longest label's record framing + BOUNDARY_SLACK
    subset_size: int          # N
    record_cap: int           # max_record_tokens in force (given or derived)

    @property
    def longest_prompt(self) -> int:
        """Instruction + N records at the cap + label line + T_max generated tokens."""
        return (self.static_tokens + self.max_tokens
                + self.subset_size * (self.record_cap + self.per_record_overhead))

    @property
    def prompt_limit(self) -> int:
        """Most tokens a group prompt may have before generation (T_max tokens are appended); 0: none."""
        return self.context - self.max_tokens if self.context else 0


def context_length(lm) -> int:
    """The model's context in positions (`max_position_embeddings`), 0 when it does not say."""
    model_config = getattr(getattr(lm, "model", None), "config", None)
    return int(getattr(model_config, "max_position_embeddings", 0) or 0)


def prompt_budget(encode: Callable[[str], list[int]], context: int, spec, labels: Sequence[str], config
                  ) -> PromptBudget:
    """The record cap in force and the longest group prompt, checked against `context`.

    `encode` is the model's tokenizer (text -> ids), `spec` the task spec (its generation
    prompt and label names), `labels` the label names generated for, `config` a GenerationConfig. Uses public
    inputs only, so it can run (and refuse) before the charge. ConfigError naming
    max_record_tokens, max_tokens or subset_size when the prompt cannot fit.
    """
    prompt = spec.generation
    # Every label of the task (and any other generated for): the cap is a function of the task and
    # the settings, the same whichever labels one call generates.
    names = list(dict.fromkeys([*getattr(spec, "label_names", []), *labels])) or [""]
    static = len(encode(prompt.header())) + max(len(encode(prompt.query(y))) for y in names)
    overhead = max(len(encode(prompt.demo(y, ""))) for y in names) + BOUNDARY_SLACK
    fixed = static + int(config.max_tokens)
    n = int(config.subset_size)
    cap = getattr(config, "max_record_tokens", None)
    if not context:  # a model without a stated context: nothing to check against
        derived = None
    else:
        derived = (context - fixed) // n - overhead
    if cap is None:
        if derived is None:
            raise ConfigError(f"{flag('max_record_tokens')}: the model states no context length; set it")
        if derived < 1:
            raise ConfigError(
                f"{flag('max_tokens')} (T_max) = {config.max_tokens} and {flag('subset_size')} (N) = {n} leave no room "
                f"for records in "
                f"the model's context of {context} positions (instruction and label lines take {static}, "
                f"each record's framing {overhead}): lower either"
            )
        cap = derived
    elif int(cap) != cap or cap < 1:
        raise ConfigError(f"{flag('max_record_tokens')} must be an integer >= 1, got {cap!r}")
    budget = PromptBudget(context=context, static_tokens=static, max_tokens=int(config.max_tokens),
                          per_record_overhead=overhead, subset_size=n, record_cap=int(cap))
    if context and budget.longest_prompt > context:
        raise ConfigError(
            f"{flag('max_record_tokens')} = {cap}: a group prompt of the instruction, {flag('subset_size')} (N) = {n} "
            f"records of {cap} tokens and {flag('max_tokens')} (T_max) = {config.max_tokens} generated tokens needs "
            f"up to "
            f"{budget.longest_prompt} positions, more than the model's context of {context}; lower "
            f"--max-record-tokens (at most {max(derived or 0, 0)} here), --subset-size or --max-tokens"
        )
    return budget


def tokens_at_most_bytes(lm) -> bool:
    """Whether `lm`'s tokenizer provably gives at most (UTF-8 bytes + 1) tokens for any text:
    byte-level BPE without a normalizer (each token covers at least one byte; +1 for a prefix
    space). Then a record that short needs no tokenisation to know it is within the cap."""
    backend = getattr(getattr(lm, "tokenizer", None), "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return False
    return type(backend.model).__name__ == "BPE" and type(backend.pre_tokenizer).__name__ == "ByteLevel"


def truncate_records(lm, texts: Sequence[str], cap: int) -> list[str]:
    """Each text cut to at most `cap` tokens of `lm`'s tokenizer (texts within the cap unchanged).

    A cut text is the decoding of its first k tokens, with k the largest value (<= cap) whose
    decoding re-encodes to at most `cap` tokens (decoding a partial multi-byte token can
    re-encode longer). A per-record transformation: it never looks at another record.
    With a byte-level tokenizer (`tokens_at_most_bytes`) only texts of more than cap - 1 bytes
    are tokenised (the others cannot exceed the cap): AG News' 120,000 records cost nothing.
    """
    out = list(texts)
    if tokens_at_most_bytes(lm):
        candidates = [i for i, text in enumerate(out) if len(text.encode("utf-8")) + 1 > cap]
    else:
        candidates = list(range(len(out)))
    for index, ids in zip(candidates, lm.encode_batch([out[i] for i in candidates]), strict=True):
        if len(ids) > cap:
            out[index] = _cut(lm, ids, cap)
    return out


def _cut(lm, ids: list[int], cap: int) -> str:
    keep = int(cap)
    cut = lm.decode(ids[:keep])
    while keep > 0 and len(lm.encode(cut)) > cap:
        keep -= 1
        cut = lm.decode(ids[:keep])
    return cut


def fit_group(build: Callable[[list[str]], str], encode: Callable[[str], list[int]], group: list[str],
              limit: int, ids: list[int] | None = None) -> list[int]:
    """Token ids of `build(group)`, dropping the group's last records until they fit `limit`.

    `ids`: the already-encoded full prompt, if the caller has it. `limit` <= 0: no limit.
    A function of the group's own records only (the sensitivity argument is unchanged).
    """
    if ids is None:
        ids = encode(build(group))
    count = len(group)
    while limit > 0 and len(ids) > limit and count > 0:
        count -= 1
        ids = encode(build(group[:count]))
    return ids


# Models built in code rather than loaded (tasks.common.TINY_MODEL_NAMES, `LanguageModel.random`):
# their tokenizers (the tiny one cut to its first words) and the context their shapes declare.
_TINY_NAMES = ("tiny-random", "tiny-random-llama")
_TINY_CONTEXT = 2048  # LanguageModel.tiny_random's max_position_embeddings


def model_tokenizer_and_context(model: str):
    """(encode: text -> ids, context positions) of a model by name, without loading its weights."""
    from transformers import AutoConfig

    # torch loads here, not when the module is imported
    from dpcore.lm.model import RANDOM_SHAPES

    if model in _TINY_NAMES:
        path, context = tiny_tokenizer_folder(), _TINY_CONTEXT
    elif model.startswith("random-") and model.removeprefix("random-") in RANDOM_SHAPES:
        path = resolve_model("smollm2-135m").path
        context = int(RANDOM_SHAPES[model.removeprefix("random-")]["max_position_embeddings"])
    else:
        path = resolve_model(model).path
        context = int(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 0) or 0)
    tokenizer = _tokenizer(str(path), _folder_stamp(path))
    return (lambda text: tokenizer.encode(text, add_special_tokens=False)), context


def _folder_stamp(path) -> tuple:
    """What identifies a model folder's tokenizer files on disk (names, sizes, modification times)."""
    folder = Path(path)
    if not folder.is_dir():
        return ()
    stats = [(f.name, f.stat()) for f in folder.iterdir() if "token" in f.name and f.is_file()]
    return tuple(sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats))


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, stamp: tuple):
    """A model folder's tokenizer, loaded once per process while its files are unchanged (`stamp`): every
    check before a charge asks for it, and loading one parses its whole vocabulary (about half a second)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def check_model_budget(model: str, spec, labels: Sequence[str], config) -> PromptBudget:
    """`prompt_budget` for a model by name, from its tokenizer and configuration only (no weights
    are loaded): the check a run makes before it charges the ledger."""
    encode, context = model_tokenizer_and_context(model)
    return prompt_budget(encode, context, spec, labels, config)
