"""seqlm's version, in this one place: pyproject.toml reads it (setuptools' dynamic version, by attr), and so
do seqlm.__version__, `seqlm --version` and the installed package's metadata."""

__version__ = "0.1.0"
