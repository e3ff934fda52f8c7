"""Model resolution and the LM primitive."""

from __future__ import annotations

import pytest
import torch

from dpcore.errors import ModelNotFoundError
from dpcore.lm.model import LanguageModel
from dpcore.lm.models import resolve_model

# The embedded model's own tests (converted once, loaded, predicting) are in test_icl.py, where one worker loads it.


def test_a_folder_is_made_once_and_a_second_process_waits_for_it(tmp_path):
    """`_make_folder` under its lock: a second maker (another `dpicl` command on the same home) waits for the first
    and takes its folder instead of making it again; a failed fill leaves neither the folder nor its work folder."""
    import threading

    from dpcore.lm.models import _make_folder

    target, started, release, calls = tmp_path / "models" / "m", threading.Event(), threading.Event(), []

    def slow_fill(work):
        calls.append("first")
        started.set()
        assert release.wait(10)
        (work / "marker").write_text("first")

    first = threading.Thread(target=_make_folder, args=(target, "marker", slow_fill))
    first.start()
    assert started.wait(10)
    second = []
    waiter = threading.Thread(target=lambda: second.append(_make_folder(target, "marker", lambda w: calls.append("x"))))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not target.exists()  # waiting on the lock, nothing renamed yet
    release.set()
    first.join(10)
    waiter.join(10)
    assert second == [target] and calls == ["first"] and (target / "marker").read_text() == "first"

    def failing_fill(work):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _make_folder(tmp_path / "models" / "n", "marker", failing_fill)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".m.lock", ".n.lock", "m"]


def test_the_gguf_conversion_prints_no_bar_of_its_own(capfd):
    """transformers' bar over a GGUF's tensors ignores its bar setting: the conversion's `quiet_loading` turns it
    off itself, and puts it back after."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from dpcore.lm.models import quiet_loading

    def converted() -> str:
        for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        return capfd.readouterr().err

    bar = gguf_utils.tqdm
    with quiet_loading():
        assert converted() == ""
    assert gguf_utils.tqdm is bar and "Converting and de-quantizing" in converted()


def test_the_tiny_tokenizer_is_read_from_the_gguf_without_converting_the_model(tiny_lm, tmp_path, monkeypatch):
    """A fresh home's `tiny-random` needs seconds, not the embedded model's conversion (about 20 s): its tokenizer
    comes from the GGUF, the same files as when it is cut from the converted folder."""
    from dpcore.lm.models import tiny_tokenizer_folder

    shared = tiny_tokenizer_folder()
    monkeypatch.setenv("DPICL_HOME", str(tmp_path))
    fresh = tiny_tokenizer_folder()
    assert fresh.parent == tmp_path / "models" and not (tmp_path / "models" / "smollm2-135m").exists()
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in shared.iterdir())
    assert all((fresh / p.name).read_bytes() == p.read_bytes() for p in shared.iterdir())


def test_local_folder_resolves(tmp_path, tiny_lm):
    tiny_lm.model.save_pretrained(tmp_path / "tiny")
    tiny_lm.tokenizer.save_pretrained(tmp_path / "tiny")
    resolved = resolve_model(str(tmp_path / "tiny"))
    assert resolved.kind == "local"
    loaded = LanguageModel.load(str(tmp_path / "tiny"))
    ids = [loaded.encode("hello world")]
    assert torch.allclose(loaded.next_token_logits(ids), tiny_lm.next_token_logits(ids), atol=1e-5)


def test_missing_model_names_everything_tried(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("no-such-org/no-such-model")
    message = str(info.value)
    assert "embedded models (smollm2-135m)" in message
    assert "local folder" in message and "Hugging Face hub id" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(empty))


def test_left_padded_batch_equals_one_at_a_time(tiny_lm):
    prompts = [tiny_lm.encode(t) for t in ("a", "a much longer prompt with many tokens in it", "mid size text")]
    batched = tiny_lm.next_token_probs(prompts)
    for row, ids in enumerate(prompts):
        assert torch.allclose(batched[row], tiny_lm.next_token_probs([ids])[0], atol=1e-5)
    # micro-batching (tiny token budget) changes nothing
    assert torch.allclose(tiny_lm.next_token_probs(prompts, max_batch_tokens=8), batched, atol=1e-5)


def test_empty_prompt_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="empty prompt"):
        tiny_lm.next_token_logits([[]])


def test_random_shapes_match_the_embedded_model_and_a_1b_llama():
    """Speed benchmarks on random weights are only meaningful if the shape is the real one: the embedded model's
    shape is read from its converted folder's config (its weights are not needed to count them)."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from dpcore.lm.model import RANDOM_SHAPES, LanguageModel

    embedded = AutoConfig.from_pretrained(resolve_model("smollm2-135m").path)
    with torch.device("meta"):
        embedded_parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(embedded).parameters())
    with torch.device("meta"):  # the shape alone: no 135M random numbers drawn (seconds of CPU)
        random_135m = LanguageModel.random("smollm2-135m", device="meta", dtype="float32")
    assert random_135m.num_parameters(include_embeddings=True) == embedded_parameters
    assert random_135m.vocab_size == embedded.vocab_size
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        assert getattr(random_135m.model.config, key) == getattr(embedded, key), key
    with torch.device("meta"):
        body = LlamaForCausalLM(LlamaConfig(vocab_size=embedded.vocab_size, tie_word_embeddings=True,
                                            **RANDOM_SHAPES["llama-1b"]))
    total = sum(p.numel() for p in body.parameters())
    assert 0.9e9 < total < 1.3e9
    with pytest.raises(ValueError, match="unknown random shape"):
        LanguageModel.random("gpt-5")


def test_a_model_folders_tokenizer_is_loaded_once_until_its_files_change(tmp_path, tiny_lm):
    """The check before a charge reads a model's tokenizer by name (`model_tokenizer_and_context`): loaded once per
    process, and again when the folder's tokenizer files change."""
    import os

    from dpcore.lm.budget import _tokenizer, model_tokenizer_and_context

    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    _tokenizer.cache_clear()
    encode, _ = model_tokenizer_and_context(str(tmp_path))
    assert encode("hello world") == tiny_lm.encode("hello world")
    model_tokenizer_and_context(str(tmp_path))
    assert _tokenizer.cache_info().misses == 1 and _tokenizer.cache_info().hits == 1
    later = (tmp_path / "tokenizer.json").stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "tokenizer.json", ns=(later, later))
    model_tokenizer_and_context(str(tmp_path))
    assert _tokenizer.cache_info().misses == 2


def test_the_tiny_model_reads_the_embedded_tokenizer_cut_to_its_first_words(tiny_lm):
    """`tiny-random`'s tokenizer: the embedded one's first `TINY_VOCABULARY` words (the same strings and ids), its
    special tokens and chat template, and every shipped task's labels in as many tokens as in the embedded tokenizer
    (one for most: a random model's label distribution then stays near uniform); any text still round-trips."""
    from transformers import AutoTokenizer

    from dpcore.data.taskspec import TASKS_DIR, load_task_spec
    from dpcore.lm.icl import label_token_ids
    from dpcore.lm.models import TINY_LABEL_WORDS, TINY_VOCABULARY

    full = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m").path)
    tiny = tiny_lm.tokenizer
    assert TINY_VOCABULARY <= tiny_lm.vocab_size == len(tiny) < TINY_VOCABULARY + 4 * len(TINY_LABEL_WORDS)
    assert [tiny.convert_ids_to_tokens(i) for i in range(TINY_VOCABULARY)] == \
        [full.convert_ids_to_tokens(i) for i in range(TINY_VOCABULARY)]
    assert tiny.convert_tokens_to_ids("<|im_end|>") == 2 and 2 in tiny_lm.eos_token_ids
    assert tiny.chat_template == full.chat_template
    for text in ("Wall St. Bears Claw Back Into the Black (Reuters)", "naïve café, 東京 ✓ 42%\n\tend"):
        ids = tiny_lm.encode(text)
        assert tiny.decode(ids) == text and max(ids) < tiny_lm.vocab_size
        assert len(ids) >= len(full.encode(text, add_special_tokens=False))  # fewer merges: more, shorter tokens
    for path in sorted(TASKS_DIR.glob("*.yaml")):
        spec = load_task_spec(path.stem)
        if spec.kind != "classification":
            continue
        words = [spec.verbalizer(label) for label in spec.label_names]
        assert set(words) <= set(TINY_LABEL_WORDS), path.name
        assert [len(ids) for ids in label_token_ids(tiny_lm, spec, spec.label_names)] == \
            [len(full.encode(" " + word, add_special_tokens=False)) for word in words], path.name
