"""Only the optional C extension lives here; everything else is in pyproject.toml.

``dlctl._speedups`` (the bootstrap copy's per-record loops) is built when a C compiler is
present; without one the install still succeeds and dlctl runs the same loops in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dlctl._speedups", sources=["dlctl/_speedups.c"], optional=True, extra_compile_args=["-O2"])])
