"""Model cards: Hub metadata that is true (no local path as base_model, datasets, draft tags), the exact target,
and a usage snippet that runs."""

from __future__ import annotations

import re

import pytest
from conftest import make_tiny_llama, make_tiny_tokenizer
from huggingface_hub import ModelCard

from domino_hf import DominoDraftModel
from domino_hf.modeling import REMOTE_CODE_FILES
from domino_hf.targets import SMOLLM2_HUB_ID, SMOLLM2_PACKAGED_NAME
from domino_hf.training.export import export_draft, model_card

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(params=["chat", "base"])
def local_run(tmp_path, request):
    """A draft trained (here: built) for a target that lives in a local folder, saved as a draft folder; the target
    is an instruct model (a chat template) or a base model (none)."""
    tokenizer = make_tiny_tokenizer() if request.param == "chat" else make_tiny_tokenizer(chat_template=None)
    target = make_tiny_llama(tokenizer)
    target.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    draft = DominoDraftModel.from_target(target, tokenizer, block_size=4)
    draft.config.target_name_or_path = str(tmp_path / "tiny")
    draft.save_pretrained(tmp_path / "draft")
    return tmp_path


def _meta(card: str) -> dict:
    return ModelCard(card).data.to_dict()


def test_local_target_gets_no_base_model_and_a_runnable_snippet(local_run, monkeypatch):
    out = export_draft(local_run / "draft", local_run / "export", dtype="float32")
    card = (out / "README.md").read_text()
    meta = _meta(card)
    assert "base_model" not in meta and "datasets" not in meta
    assert meta["pipeline_tag"] == "text-generation" and meta["library_name"] == "transformers"
    assert {"speculative-decoding", "draft-model", "domino"} <= set(meta["tags"])
    assert '"<your-username>/export"' in card  # a Hub id to fill in, never the local export folder
    # The local target by its folder's name: its absolute path means nothing on the Hub.
    assert str(local_run) not in card
    assert "# Domino draft for tiny\n" in card and 'TARGET = "tiny"' in card and "local folder, `tiny`" in card

    # The snippet itself runs: pointed at the exported folder, from the folder that holds the target, it generates
    # with the draft.
    monkeypatch.chdir(local_run)
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("<your-username>/export", str(out))
    namespace = {}
    exec(compile(snippet, "card-snippet", "exec"), namespace)
    assert namespace["draft"].last_generation_stats.num_steps > 0
    assert namespace["out"].shape[1] > namespace["inputs"]["input_ids"].shape[1]


def test_base_model_and_datasets_metadata(local_run):
    out = export_draft(local_run / "draft", local_run / "e2", base_model="me/tiny-target",
                       datasets=["anon8231489123/ShareGPT_Vicuna_unfiltered"], repo_id="me/tiny-domino")
    card = (out / "README.md").read_text()
    meta = _meta(card)
    assert meta["base_model"] == "me/tiny-target" and meta["base_model_relation"] == "adapter"
    assert meta["datasets"] == ["anon8231489123/ShareGPT_Vicuna_unfiltered"]
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny-target")' in card
    assert "# Domino draft for me/tiny-target\n" in card and str(local_run) not in card
    assert 'AutoModel.from_pretrained("me/tiny-domino", trust_remote_code=True)' in card


@pytest.mark.parametrize("bad", ["tiny", "./tiny", "runs/x/tiny", "{tmp}/tiny"])
def test_a_local_path_is_refused_as_base_model_before_writing(local_run, bad):
    with pytest.raises(ValueError, match="not a Hub model id `owner/name`"):
        export_draft(local_run / "draft", local_run / "e3", base_model=bad.format(tmp=local_run))
    assert not (local_run / "e3").exists()


def test_packaged_smollm2_is_described_exactly(local_run):
    draft = DominoDraftModel.from_pretrained(local_run / "draft")
    draft.config.target_name_or_path = SMOLLM2_PACKAGED_NAME
    card = model_card(draft, "me/smollm2-domino")
    meta = _meta(card)
    assert meta["base_model"] == SMOLLM2_HUB_ID  # the Hub model the packaged GGUF was quantised from
    assert "Q4_1 GGUF dequantised to fp32" in card and "untested" in card
    assert 'load_target("smollm2")' in card.split("## Usage")[1].split("## Target")[0]
    assert f'from_pretrained("{SMOLLM2_HUB_ID}")' not in card  # never presented as the Hub weights


def test_cli_export_with_trainer_style_push_options(local_run, monkeypatch):
    """`--push_to_hub --hub_model_id` (and the short `--push-to-hub REPO`) create, write the card for, and upload
    to the repo id the Hub returns; the Hub itself is replaced by a recorder (no network here)."""
    import huggingface_hub

    from domino_hf.cli import main

    calls = []

    class RecordingApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create", repo_id, private))
            return type("RepoUrl", (), {"repo_id": repo_id if "/" in repo_id else f"me/{repo_id}"})()

        def upload_folder(self, folder_path, repo_id, commit_message):
            calls.append(("upload", repo_id))

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    out = local_run / "pushed"
    assert main(["export", str(local_run / "draft"), "--output_dir", str(out), "--push_to_hub"]) == 0
    assert calls == [("create", "pushed", False), ("upload", "me/pushed")]  # Trainer default: the folder's name
    assert 'AutoModel.from_pretrained("me/pushed", trust_remote_code=True)' in (out / "README.md").read_text()
    calls.clear()
    assert main(["export", str(local_run / "draft"), "--out", str(out), "--push-to-hub", "org/d", "--private"]) == 0
    assert calls == [("create", "org/d", True), ("upload", "org/d")]


def test_push_draft_uploads_the_domino_card(local_run, monkeypatch):
    """The API path (`push_draft`): the uploaded folder holds the Domino card with its tags, not 🤗's generic
    card. The Hub is replaced by a recorder of the folder."""
    import huggingface_hub

    from domino_hf.training.export import push_draft

    uploaded = {}

    class RecordingApi:
        def __init__(self, token=None):
            uploaded["token"] = token

        def create_repo(self, repo_id, private=None, exist_ok=False):
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def upload_folder(self, folder_path, repo_id, revision, create_pr, commit_message):
            from pathlib import Path

            uploaded.update(repo=repo_id, files=sorted(p.name for p in Path(folder_path).iterdir()),
                            card=(Path(folder_path) / "README.md").read_text())
            return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    draft = DominoDraftModel.from_pretrained(local_run / "draft")
    url = push_draft(draft, "me/api-draft", token="hf_x", base_model="me/tiny-target", tags=["my-tag", "domino"])
    assert url.endswith("/commit/0")
    assert uploaded["token"] == "hf_x" and uploaded["repo"] == "me/api-draft"
    assert uploaded["files"] == sorted(["README.md", "config.json", "generation_config.json", "model.safetensors",
                                        *REMOTE_CODE_FILES])
    meta = _meta(uploaded["card"])
    assert "draft-model" in meta["tags"] and meta["base_model"] == "me/tiny-target"
    assert "my-tag" in meta["tags"] and meta["tags"].count("domino") == 1
    assert "# Domino draft for me/tiny-target" in uploaded["card"]


def test_model_push_to_hub_is_tagged_as_a_draft(monkeypatch):
    """`DominoDraftModel.push_to_hub` is 🤗's (the remote code imports nothing from domino-hf), with the draft tags
    added to the caller's; `push_draft` is the path with the Domino card."""
    from conftest import make_tiny_draft, make_tiny_target
    from transformers import PreTrainedModel

    calls = []
    monkeypatch.setattr(PreTrainedModel, "push_to_hub", lambda self, repo, **kw: calls.append((repo, kw)) or "url")
    draft = make_tiny_draft(make_tiny_target("llama"))
    assert draft.push_to_hub("me/draft", private=True, tags=["mine"]) == "url"
    assert calls == [("me/draft", {"private": True, "tags": ["mine", "speculative-decoding", "draft-model", "domino"]})]
