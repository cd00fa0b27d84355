"""The project layer: the docs' code blocks, the examples and the wheels, as shipped; the
public surface and the modules' layering, read from the source; and where log events go
in a fresh interpreter, as an application configures logging.

These need the dev extra (PyYAML through mkdocs, setuptools and mypy for the wheels).
"""
