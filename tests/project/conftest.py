"""The project layer: the docs' code blocks, the examples and the wheels, as shipped.

These need the dev extra (PyYAML through mkdocs, setuptools and mypy for the wheels).
"""
