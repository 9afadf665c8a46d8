"""Package discovery for the layout in which the repository root is the package `sleuth`: each top-level
folder with an `__init__.py` is a subpackage `sleuth.<folder>`, and every folder below it ships too (data
folders such as `tasks/swe_sets` as namespace packages, so their files are package data). Folders without
an `__init__.py` at the top (tests, bench, docs, configs, examples, install, runs) are not the package, and
this file is not one of its modules. pyproject.toml holds the rest of the metadata."""

from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("sleuth", "setup")]


top = sorted(p.parent.name for p in Path(__file__).resolve().parent.glob("*/__init__.py"))
below = find_namespace_packages(where=".", include=[f"{t}.*" for t in top], exclude=["*__pycache__*"])
setup(packages=["sleuth", *(f"sleuth.{p}" for p in [*top, *below])], cmdclass={"build_py": BuildPy})
