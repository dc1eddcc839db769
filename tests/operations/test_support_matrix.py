"""The floors pyproject.toml declares are exactly what the matrix's floor cell installs
(requirements/floor.txt), so the lowest versions a user may install are the tested ones."""

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the floor cell): pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_floors():
    """``{package: lowest version}`` of pyproject's dependencies and optional dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"],
                    *(item for extra in project["optional-dependencies"].values() for item in extra)]
    floors = {}
    for text in requirements:
        requirement = Requirement(text)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lower) == 1, f"{text}: one >= floor expected"
        floors[canonical(requirement.name)] = Version(lower[0])
    return floors


def floor_cell_pins():
    """``{package: pinned version}`` of requirements/floor.txt."""
    pins = {}
    for line in (ROOT / "requirements" / "floor.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"floor.txt: {line!r} is not pinned with =="
            pins[canonical(name)] = Version(version)
    return pins


def test_the_floor_cell_installs_exactly_the_declared_floors():
    floors, pins = declared_floors(), floor_cell_pins()
    assert {name: pins.get(name) for name in floors} == floors


def test_the_supported_floors_are_the_verified_ones():
    # docs/reference/support.md says why each is what it is (e.g. redis-py < 5.3 cannot decide)
    assert declared_floors() == {
        "django": Version("5.2"), "django-redis": Version("5.4"), "redis": Version("5.3"),
        "hiredis": Version("3.2"), "djangorestframework": Version("3.16"),
        "prometheus-client": Version("0.20")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"


def cell_pins(cell):
    """``{package: pinned version}`` of requirements/<cell>.txt."""
    pins = {}
    for line in (ROOT / "requirements" / f"{cell}.txt").read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if version:
            pins[canonical(name)] = Version(version)
    return pins


def test_the_version_check_knows_the_tested_range():
    # ratelimit_app.operations.support feeds the E009/W005 checks: its floors are pyproject's, and
    # its newest tested major.minor is what the current cell installs
    from ratelimit_app.operations.support import SUPPORTED

    floors, current = declared_floors(), cell_pins("current")
    for entry in SUPPORTED:
        name = canonical(entry.distribution)
        assert Version(entry.floor) == floors[name], name
        newest = current[name]
        assert Version(entry.newest_tested) == Version(f"{newest.major}.{newest.minor}"), name


def test_the_readme_states_the_declared_support():
    # the front page's support table, pyproject's classifiers and floors say the same thing
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Supported versions"):]
    table = table[:table.index("\n## ")]
    labels = {"djangorestframework": "Django REST framework", "django-redis": "django-redis",
              "redis": "redis-py", "hiredis": "hiredis"}
    for name, floor in declared_floors().items():
        if name in labels:
            assert f"| {labels[name]} | ≥ {floor}" in table, name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pythons = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
               if c.startswith("Programming Language :: Python :: 3.")]
    djangos = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
               if c.startswith("Framework :: Django :: ")]
    assert f"| Python | {', '.join(pythons)} |" in table
    assert all(version in table.split("| Django |")[1].split("\n")[0] for version in djangos)
