"""Target loading: local folders, the cached offline SmolLM2 (atomic cache writes), the real thing."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import make_tiny_llama, make_tiny_tokenizer, requires_offline_target

from domino_hf import targets
from domino_hf.targets import SMOLLM2_CACHE_NAME, SMOLLM2_HUB_ID, SMOLLM2_PACKAGED_NAME, load_target


@pytest.fixture
def fake_gguf(monkeypatch, tmp_path):
    """Stand the tiny model in for the GGUF dequantization, in a private cache; returns a call log."""
    monkeypatch.setenv("DOMINO_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(targets, "_smollm2_package_dir", lambda: tmp_path)
    calls = []
    real_model_loader = targets.AutoModelForCausalLM.from_pretrained
    real_tokenizer_loader = targets.AutoTokenizer.from_pretrained

    def model_loader(folder, **kwargs):
        if "gguf_file" not in kwargs:
            return real_model_loader(folder, **kwargs)
        calls.append(kwargs["gguf_file"])
        return make_tiny_llama(make_tiny_tokenizer())

    def tokenizer_loader(folder, **kwargs):
        return make_tiny_tokenizer() if "gguf_file" in kwargs else real_tokenizer_loader(folder, **kwargs)

    monkeypatch.setattr(targets.AutoModelForCausalLM, "from_pretrained", model_loader)
    monkeypatch.setattr(targets.AutoTokenizer, "from_pretrained", tokenizer_loader)
    return calls


def test_local_folder(tmp_path):
    tokenizer = make_tiny_tokenizer()
    make_tiny_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded = load_target(str(tmp_path))
    assert not model.training and model.config.vocab_size == len(loaded)
    assert loaded.chat_template == tokenizer.chat_template


def test_smollm2_alias_builds_the_cache_once(fake_gguf, tmp_path):
    model, _ = load_target("smollm2")
    assert fake_gguf == [targets.SMOLLM2_GGUF]
    # Named as what it is (a dequantised Q4_1 GGUF), never with the Hub id of the bf16 original.
    assert model.config._name_or_path == SMOLLM2_PACKAGED_NAME and not model.training
    cached = tmp_path / "cache" / "targets" / SMOLLM2_CACHE_NAME
    assert (cached / "model.safetensors").is_file()
    load_target("SmolLM2")
    model, _ = load_target(SMOLLM2_PACKAGED_NAME)  # the recorded name loads it back
    assert len(fake_gguf) == 1  # later loads read the cache
    assert model.config._name_or_path == SMOLLM2_PACKAGED_NAME
    assert [p.name for p in cached.parent.iterdir()] == [SMOLLM2_CACHE_NAME]  # no temp folder left


def test_hub_id_is_never_swapped_for_the_packaged_copy(fake_gguf, monkeypatch):
    """The Hub id means the Hub's weights: when they cannot be loaded, say so and name `smollm2`."""

    def hub_unreachable(folder, dtype, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")  # what an offline Hub load raises

    monkeypatch.setattr(targets, "_from_pretrained", hub_unreachable)
    match = r"could not be loaded: We couldn't connect.*Q4_1 GGUF dequantised.*use `smollm2`"
    with pytest.raises(OSError, match=match):
        load_target(SMOLLM2_HUB_ID)
    assert fake_gguf == []


@pytest.mark.parametrize("name", ["./missing", "runs/x/target", "~/no-such-folder", "/no/such/target", "missing/"])
def test_missing_local_path_is_a_clear_error(name):
    with pytest.raises(FileNotFoundError, match=r"no such folder \(relative to .*\)\. Give a model folder, a Hub id"):
        load_target(name)


def test_hub_options_reach_from_pretrained(monkeypatch):
    seen = []

    def record(folder, dtype, **kwargs):
        seen.append(kwargs)
        raise OSError("stop here")

    monkeypatch.setattr(targets, "_from_pretrained", record)
    with pytest.raises(OSError, match="not a local folder either"):
        load_target("owner/model", trust_remote_code=True, revision="v1", token="hf_x")
    assert seen == [{"trust_remote_code": True, "revision": "v1", "token": "hf_x"}]


def test_killed_cache_write_leaves_nothing(fake_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(targets.AutoTokenizer, "from_pretrained", lambda *a, **k: _Unsavable())
    with pytest.raises(KeyboardInterrupt):
        load_target("smollm2")
    assert list((tmp_path / "cache" / "targets").iterdir()) == []


class _Unsavable:
    def save_pretrained(self, *args, **kwargs):
        raise KeyboardInterrupt  # the process is killed half-way through writing the cache


def test_missing_offline_packages_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DOMINO_HF_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'domino-hf\[offline\]'"):
        load_target("smollm2")


@pytest.mark.integration
def test_real_smollm2_and_its_cache(monkeypatch):
    requires_offline_target()
    model, tokenizer = load_target("smollm2")  # builds the cache on the very first run (~20-30 s)
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert model.config._name_or_path == SMOLLM2_PACKAGED_NAME and tokenizer.eos_token == "<|im_end|>"

    def no_gguf(*args, **kwargs):
        raise AssertionError("the second load must read the safetensors cache, not the GGUF")

    monkeypatch.setattr(targets, "_smollm2_package_dir", no_gguf)
    again, _ = load_target("smollm2")  # from the cache: the GGUF is not read again
    assert again.config.num_hidden_layers == 30
