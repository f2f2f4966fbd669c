"""Shared pytest fixtures for gpumem's tests.

repo_root: the repository's root directory.
shared_snapshots: ../shared/snapshots (the real PyTorch snapshots beside the
    project); tests that use it skip, with a reason, when it is absent.
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def shared_snapshots():
    path = os.environ.get("GPUMEM_SNAPSHOTS") or os.path.join(
        os.path.dirname(ROOT), "shared", "snapshots"
    )
    if not os.path.isdir(path):
        pytest.skip("no snapshot directory at %s (set GPUMEM_SNAPSHOTS)" % path)
    return path


@pytest.fixture(scope="session")
def compile_caches(tmp_path_factory):
    """One Triton and one Inductor cache for every torch.compile test of the
    session (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR), so that a graph
    compiled by one test process is reused by the next."""
    root = tmp_path_factory.mktemp("compile_caches")
    return {"TRITON_CACHE_DIR": str(root / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
