# All metadata lives in pyproject.toml; this file lets tools that still call `setup.py` build the runtime.
from setuptools import setup

setup()
