import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def k3_bin():
    path = pathlib.Path(os.environ.get("K3_BIN", ROOT / "build" / "k3"))
    if not path.exists():
        pytest.fail(f"k3 binary not found at {path}; build first (scripts/build.sh)")
    return str(path)


@pytest.fixture(scope="session")
def root():
    return ROOT
