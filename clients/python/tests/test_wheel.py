"""The wheel a newcomer builds (``python3 -m build --wheel``): the library with its licence, not the sample app."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("build", reason="python3-build is not installed")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    (whl,) = out.glob("idempotency_pg-*.whl")
    return zipfile.ZipFile(whl)


def test_wheel_holds_the_library_and_not_the_sample_app(wheel):
    names = wheel.namelist()
    for module in ("__init__", "asgi", "core", "django", "header", "middleware", "responses"):
        assert f"idempotency_pg/{module}.py" in names, names
    assert not [n for n in names if n.startswith("payments_service")], names
    assert not [n for n in names if "tests/" in n or n.endswith(".pyc")], names


def test_wheel_has_licence_metadata(wheel):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    text = wheel.read(meta).decode()
    assert "License: PostgreSQL" in text
    assert "License-File: LICENSE" in text
    lic = next(n for n in wheel.namelist() if n.endswith(".dist-info/LICENSE"))
    assert wheel.read(lic).startswith(b"PostgreSQL License")
    assert "Requires-Dist: psycopg (>=3.1)" in text
