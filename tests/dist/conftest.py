"""Launch helpers for the pararnn-dist tests: one group of worker processes per test module.

Each worker script in ``workers/`` runs several named checks inside one process group and writes
``{check: "ok" | traceback}`` per rank to a JSON file; the tests then assert per check. Spawning
one group per module (not per test) keeps the suite inside its CI time budget on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKERS = Path(__file__).parent / "workers"
Results = dict[int, dict[str, str]]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_workers(
    script: str, out_dir: Path, *, backend: str = "gloo", world: int = 2, timeout: float = 120.0
) -> Results:
    """Run ``workers/<script>`` as ``world`` ranks; return each rank's check results."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
            PARARNN_TEST_BACKEND=backend,
            PARARNN_TEST_OUT=str(out_dir),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
            out += f"\n[timed out after {timeout} s]"
        logs.append(out)
    results: Results = {}
    for rank in range(world):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            log = "\n".join(f"--- rank {r} ---\n{text[-4000:]}" for r, text in enumerate(logs))
            pytest.fail(f"{script}: rank {rank} wrote no results\n{log}")
        results[rank] = json.loads(path.read_text())
    return results


def assert_check(results: Results, check: str) -> None:
    """Fail with every rank's message unless ``check`` passed on all ranks."""
    problems = []
    for rank, per_check in sorted(results.items()):
        outcome = per_check.get(check, "not run (an earlier failure or a typo in the name)")
        if outcome != "ok":
            problems.append(f"rank {rank}: {outcome}")
    if problems:
        pytest.fail(f"check {check!r} failed:\n" + "\n".join(problems))


def need_two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs for NCCL, found {torch.cuda.device_count()}")


class Harness:
    """What the test modules use (a fixture, since ``--import-mode=importlib`` cannot import
    ``conftest`` by name): ``launch(script, backend)`` and ``assert_check(results, check)``."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self.assert_check = assert_check

    def launch(self, script: str, backend: str = "gloo") -> Results:
        if backend == "nccl":
            need_two_gpus()
        out = self._tmp.mktemp(f"{Path(script).stem}_{backend}")
        return launch_workers(script, out, backend=backend)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return Harness(tmp_path_factory)


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=pytest.mark.cuda)])
def worker_results(request: pytest.FixtureRequest, harness: Harness) -> Results:
    """The module's ``WORKER`` script run once per backend: every rank's check outcomes."""
    script: str = request.module.WORKER
    return harness.launch(script, request.param)
