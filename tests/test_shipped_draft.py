"""The draft shipped with domino-hf by short name, from any working directory: `load_draft("smollm2")` and
`draft_path("smollm2")` (for `AutoModel.from_pretrained`); other names fail at once, naming the shipped drafts.
(The non-editable install, where the draft is package data, is tested in test_install.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_draft, make_tiny_target
from transformers import AutoModel

from domino_hf import draft_path, load_draft
from domino_hf.targets import SHIPPED_DRAFTS, SMOLLM2_PACKAGED_NAME

pytestmark = pytest.mark.usefixtures("single_thread")


def test_short_name_loads_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = draft_path("smollm2")
    assert folder.is_absolute() and folder.name == SHIPPED_DRAFTS["smollm2"]
    assert (folder / "model.safetensors").is_file()
    draft = load_draft("smollm2")
    assert type(draft).__name__ == "DominoDraftModel" and not draft.training
    assert draft.dtype == torch.float32 and draft.device.type == "cpu"  # fp32 without a target, as load_target's
    assert draft.config.target_name_or_path == SMOLLM2_PACKAGED_NAME
    assert load_draft(SHIPPED_DRAFTS["smollm2"], dtype=torch.bfloat16).dtype == torch.bfloat16  # its folder's name
    loaded = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()))


def test_a_draft_built_for_another_target_is_refused():
    target = make_tiny_target("llama").to(torch.bfloat16)
    with pytest.raises(ValueError, match=rf"does not fit the target.*built for {SMOLLM2_PACKAGED_NAME}"):
        load_draft("smollm2", target)


def test_a_folder_loads_in_the_targets_dtype(tmp_path, monkeypatch):
    target = make_tiny_target("llama")
    make_tiny_draft(target).save_pretrained(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    assert load_draft("mine", target.to(torch.bfloat16)).dtype == torch.bfloat16
    assert load_draft(str(tmp_path / "mine"), target, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("name", ["smollm", "qwen3"])
def test_unknown_short_name_lists_the_shipped_drafts(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"draft '{name}' is neither a folder.*'smollm2' \(smollm2-135m-instruct"):
        load_draft(name)
    with pytest.raises(ValueError, match=rf"no draft named '{name}' ships with domino-hf.*'smollm2'"):
        draft_path(name)


@pytest.mark.parametrize("name", ["./missing", "drafts/x/y", "/no/such/draft"])
def test_missing_folder_fails_at_once(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"draft '{name}': no such folder.*the shipped drafts are 'smollm2'"):
        load_draft(name)


def test_regen_and_lm_eval_take_the_short_name(tmp_path, monkeypatch):
    """`domino regen --draft smollm2` and lm-eval's `draft=smollm2` resolve it as `load_draft` does (a tiny target is
    then refused by the fit check, which names the shipped draft's target)."""
    from domino_hf.eval import _load_draft as eval_draft
    from domino_hf.training.regen_cli import _load_draft as regen_draft

    monkeypatch.chdir(tmp_path)
    target = make_tiny_target("llama")
    for load in (lambda: regen_draft("smollm2", target), lambda: eval_draft("smollm2", None, target)):
        with pytest.raises(ValueError, match=rf"does not fit the target.*built for {SMOLLM2_PACKAGED_NAME}"):
            load()
