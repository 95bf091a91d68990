"""The README's install (`pip install ".[offline,bench]"`, not editable) leaves the package importable with the
checkout as the working directory, where the checkout's `domino_hf/` shadows the installed one: `domino_hf.modeling`
and `domino_hf.hub_configs` (the top-level `modeling/` and `hub_configs/` folders, mapped by pyproject at install
time) are found in the checkout. A fresh venv reuses this interpreter's torch and transformers through a path
file, without this interpreter's own path files (an editable install's finder would hide the problem)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = (
    "import importlib.resources, json, sys\n"
    "from domino_hf import DominoDraftModel\n"
    "import domino_hf, domino_hf.modeling\n"
    "config = importlib.resources.files('domino_hf.hub_configs').joinpath('smollm2-135m-instruct-domino.json')\n"
    "assert json.loads(config.read_text())['model_type'] == 'domino_draft'\n"
    "print('PACKAGE', domino_hf.__file__)\n"
    "print('MODELING', domino_hf.modeling.__file__)\n"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a venv with a non-editable install of a copy of the checkout, that copy)."""
    tmp = tmp_path_factory.mktemp("install")
    checkout = tmp / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    for folder in ("domino_hf", "modeling", "hub_configs", "drafts"):
        shutil.copytree(ROOT / folder, checkout / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(site, "outer.pth").write_text("".join(f"{path}\n" for path in outer))
    result = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                             str(checkout)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return python, checkout


def _run(python: str, args: list[str], cwd: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (extra_env or {})
    return subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_non_editable_install_imports_with_the_checkout_as_working_directory(installed):
    python, checkout = installed
    result = _run(python, ["-c", CHECK], checkout)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"PACKAGE {checkout / 'domino_hf'}" in result.stdout  # the checkout's package shadows the installed one
    assert f"MODELING {checkout / 'modeling' / '__init__.py'}" in result.stdout  # the one source, no copy
    assert _run(python, ["-m", "domino_hf.cli", "--help"], checkout).returncode == 0


@pytest.mark.integration
def test_non_editable_install_imports_elsewhere(installed, tmp_path):
    python, checkout = installed
    result = _run(python, ["-c", CHECK], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "site-packages" in result.stdout and str(checkout) not in result.stdout


SHIPPED_DRAFT = (
    "import sys, torch\n"
    "from transformers import AutoModel\n"
    "from domino_hf import draft_path, load_draft\n"
    "folder = draft_path('smollm2')\n"
    "print('FOLDER', folder)\n"
    "remote = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)\n"
    "draft = load_draft('smollm2')\n"
    "assert type(draft).__name__ == 'DominoDraftModel' and draft.dtype == torch.float32, (type(draft), draft.dtype)\n"
    "assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), remote.state_dict().values()))\n"
    "print('REMOTE', type(remote).__module__)\n"
)


@pytest.mark.integration
def test_non_editable_install_ships_the_draft(installed, tmp_path):
    """`AutoModel.from_pretrained(draft_path("smollm2"), trust_remote_code=True)` (the folder's own remote code: nothing
    has imported `domino_hf.modeling` yet) and `load_draft("smollm2")` from a folder outside the checkout load the
    same weights, the installed package's data."""
    python, checkout = installed
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = _run(python, ["-c", SHIPPED_DRAFT], tmp_path, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "site-packages" in result.stdout and str(checkout) not in result.stdout
    assert "REMOTE transformers_modules" in result.stdout

