"""Fail unless the sdist and the wheel hold every file of the package in this checkout.

    python .ci/check_dist_files.py dist/dramatiq_unique-X.tar.gz dist/dramatiq_unique-X-py3-none-any.whl

A file the package reads at run time (a Lua script, a template, the stylesheet) or that type
checkers look for (``py.typed``), or a license text, is easily left out by the packaging
configuration; this names each one that is missing.
"""

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dramatiq_unique"


def package_files() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def main(sdist: str, wheel: str) -> int:
    expected = package_files()
    with tarfile.open(sdist) as archive:
        # Every name in an sdist starts with its "<name>-<version>/" folder.
        in_sdist = {name.partition("/")[2] for name in archive.getnames()}
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    missing = [
        f"{Path(dist).name} lacks {name}"
        for dist, names in ((sdist, in_sdist), (wheel, in_wheel))
        for name in sorted(expected - names)
    ]
    # The license texts pyproject.toml names, in the sdist's root and the wheel's dist-info.
    licenses = ("LICENSE", "COPYING")
    missing += [f"{Path(sdist).name} lacks {name}" for name in licenses if name not in in_sdist]
    in_dist_info = {Path(name).name for name in in_wheel if ".dist-info/licenses/" in name}
    missing += [f"{Path(wheel).name} lacks {name} in its dist-info" for name in licenses if name not in in_dist_info]
    for line in missing:
        print(line, file=sys.stderr)
    if missing:
        return 1
    data = sorted(name for name in expected if not name.endswith(".py"))
    print(f"sdist and wheel hold all {len(expected)} files of the package, {len(data)} of them not Python.")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
