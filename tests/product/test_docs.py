"""The documentation site (mkdocs.yml, docs/) builds in strict mode, and strict mode catches what
it must: a link to a missing page or to a missing heading fails the build.

Each build runs ``python -m mkdocs build --strict`` in a fresh interpreter into a temp dir, as a
developer or CI would; the README's own links (to docs pages, read on GitHub) are checked too.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def build_site(config_dir, site_dir):
    """Build the site of ``config_dir/mkdocs.yml`` strictly into ``site_dir``; return the
    CompletedProcess (MkDocs logs to stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(config_dir / "mkdocs.yml"), "--site-dir", str(site_dir)],
        cwd=config_dir, capture_output=True, text=True, timeout=120, check=False)


def copy_of_docs(destination):
    """Copy mkdocs.yml and docs/ into ``destination``; return it."""
    shutil.copy(PROJECT_ROOT / "mkdocs.yml", destination / "mkdocs.yml")
    shutil.copytree(PROJECT_ROOT / "docs", destination / "docs")
    return destination


def test_the_site_builds_strictly_and_renders_the_pages(tmp_path):
    done = build_site(PROJECT_ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr

    settings_page = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text()
    assert "<table>" in settings_page
    assert "<code>CACHE_ALIAS</code>" in settings_page
    # a link between pages is rewritten to the built page, anchor kept
    demo_page = (tmp_path / "site" / "tutorial" / "demo" / "index.html").read_text()
    assert 'href="../../howto/dashboard/"' in demo_page
    assert 'href="../../reference/commands/"' in demo_page
    # the site loads nothing from a third party (the theme's highlight.js CDN is switched off)
    assert "cdnjs" not in demo_page


@pytest.mark.parametrize("target", [
    "settings.md#no-such-heading", "no-such-page.md", "#no-such-heading",
], ids=["anchor on another page", "missing page", "anchor on the same page"])
def test_a_broken_link_fails_the_strict_build(tmp_path, target):
    docs = copy_of_docs(tmp_path)
    page = docs / "docs" / "reference" / "checks.md"
    page.write_text(page.read_text() + f"\nSee [this]({target}).\n")

    done = build_site(docs, tmp_path / "site")

    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, done.stderr
    assert "'reference/checks.md'" in warnings[0] and f"'{target}'" in warnings[0]


def test_the_readme_links_to_pages_that_exist():
    """README.md is read on GitHub, outside the site: its relative links must name real files."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme)
               if not re.match(r"[a-z]+:|#", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (PROJECT_ROOT / t.split("#")[0]).exists()]
    assert missing == []


def test_the_admin_howto_shows_every_screenshot_the_script_makes():
    """docs/howto/admin.md embeds what scripts/admin-screenshots.py writes, and nothing else
    under img/admin/ (the script is run by hand, not by the suite: it takes a minute)."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("admin_screenshots",
                                                  root / "scripts" / "admin-screenshots.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shown = re.findall(r"\]\(img/admin/([^)]+)\)", (root / "docs/howto/admin.md").read_text())
    assert sorted(shown) == sorted(script.image_names())
    assert sorted(p.name for p in (root / "docs/howto/img/admin").iterdir()) == \
        sorted(script.image_names())
