"""The documentation runs and its links resolve.

* Every Python block of docs/getting-started.md, docs/custom-cells.md and docs/numerics.md runs,
  in order, as one script per page (on the CPU here), so the pages cannot drift from the API.
* The custom cell of docs/custom-cells.md, solved by Newton, equals the sequential recurrence:
  float64 Newton (tol 1e-12) within 1e-9 of float64 ``sequential_apply``; float32 Newton with the
  default config within 1e-5 of it (absolute; the cell's states lie in [-1, 1]) -- the
  tolerances tests/core applies to the built-in cells.
* Every relative link and image in README.md and docs/**/*.md points at an existing file, and
  every ``#anchor`` at a heading of its target page.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pararnn_core as pc

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.rglob("*.md")])

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HTML_SRC = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: these tiny problems gain nothing from more, and on a CPU shared with
    other jobs extra threads spin-wait (the eager block scan ran 40x slower with 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_python_blocks(page: Path) -> dict[str, Any]:
    """Execute the page's ```python blocks in order in one namespace; return the namespace."""
    text = page.read_text(encoding="utf-8")
    blocks = _PYTHON_BLOCK.findall(text)
    assert blocks, f"{page} has no python blocks"
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{page.relative_to(REPO)} (python block {i + 1})", "exec")
        exec(code, namespace)
    return namespace


@pytest.fixture(scope="module")
def custom_cells() -> dict[str, Any]:
    torch.manual_seed(0)
    return run_python_blocks(DOCS / "custom-cells.md")


def test_getting_started_runs() -> None:
    namespace = run_python_blocks(DOCS / "getting-started.md")
    assert [s.iters for s in namespace["rnn"].last_stats] == [3, 3]


def test_numerics_divergence_example_runs() -> None:
    torch.manual_seed(0)
    namespace = run_python_blocks(DOCS / "numerics.md")
    assert namespace["stats"].fallback == "sequential"
    assert torch.isfinite(namespace["states"]).all()


@pytest.mark.parametrize("name", ["TwoTimescaleCell", "TwoTimescaleCellAnalytic"])
def test_custom_cell_newton_equals_sequential(custom_cells: dict[str, Any], name: str) -> None:
    cls = custom_cells[name]
    torch.manual_seed(3)
    cell = cls(4, 6, dtype=torch.float64)
    assert isinstance(cell, pc.ParaCell) and cell.structure == pc.Block(2)
    x = torch.randn(3, 200, 4, dtype=torch.float64)
    h0 = 0.5 * torch.randn(3, 6, 2, dtype=torch.float64)
    tight = pc.NewtonConfig(max_iters=20, tol=1e-12)
    with torch.no_grad():
        reference = pc.sequential_apply(cell, x, h0)
        states, stats = pc.newton_apply(cell, x, h0, config=tight)
        states32, stats32 = pc.newton_apply(cell.float(), x.float(), h0.float())
    assert stats.converged and stats.max_residual <= 1e-12, stats
    err64 = (states - reference).abs().max().item()
    err32 = (states32.double() - reference).abs().max().item()
    assert err64 <= 1e-9, f"{name} float64 Newton vs sequential: {err64:.2e} > 1e-9"
    assert err32 <= 1e-5, f"{name} float32 Newton vs float64 sequential: {err32:.2e} > 1e-5"
    assert stats32.iters == 3 and stats32.converged, stats32


def test_custom_cell_analytic_jacobian_is_used_and_correct(custom_cells: dict[str, Any]) -> None:
    analytic = custom_cells["TwoTimescaleCellAnalytic"](3, 4, dtype=torch.float64)
    assert type(analytic).step_and_jacobian is not pc.ParaCell.step_and_jacobian
    h = 0.5 * torch.randn(5, 9, 4, 2, dtype=torch.float64)
    u = torch.randn(5, 9, analytic.d_u, dtype=torch.float64)
    _, jac = analytic.step_and_jacobian(h, u)
    full = torch.func.jacrev(lambda s: analytic.step(s, u[1, 2]))(h[1, 2])  # [4, 2, 4, 2]
    blocks = torch.einsum("dide->die", full)
    assert torch.allclose(jac[1, 2], blocks, atol=1e-13)


# ------------------------------------------------------------------------------------------------
# Links
# ------------------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            slug = _slug(match.group(1))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page: Path) -> list[str]:
    text = _INLINE_CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    return _LINK.findall(text) + _HTML_SRC.findall(text)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no file {_shown(resolved)})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {_shown(resolved)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)} links to missing targets:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_and_misses() -> None:
    readme_links = links(REPO / "README.md")
    assert "docs/index.md" in readme_links and "docs/img/newton_iterations.png" in readme_links
    assert _slug("`ParaRNN.forward`") == "pararnnforward"
    assert _slug("ParaGRU — diagonal") == "paragru--diagonal"


def test_a_missing_target_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [bad](#nope) ![img](img/none.png) `[no](x.md)`\n")
    broken = broken_links(page)
    assert len(broken) == 2, broken
    assert broken[0].startswith("#nope (no heading #nope in ")
    assert broken[1].startswith("img/none.png (no file ")
