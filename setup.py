"""seqlm's compiled loops as extension modules of the package, built when the wheel is built (or an sdist or
checkout installed). They use CPython's C API and the buffer protocol only, not torch's C++ API, so one build
serves any torch version. Where no compiler is found, the install goes on without them and the Python twins
run (seqlm --version says which); everything else is in pyproject.toml."""

import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FLAGS = ["-O2", "-std=c++17"]
EXTENSIONS = [
    Extension("seqlm.ngram._seqlm_native", ["src/seqlm/ngram/_native.cpp", "src/seqlm/ngram/_kenlm_calls.cpp",
                                            "src/seqlm/ngram/_lexicon.cpp", "src/seqlm/ngram/_state.cpp",
                                            "src/seqlm/ngram/_arpa_text.cpp", "src/seqlm/ngram/_sort.cpp",
                                            "src/seqlm/ngram/_count.cpp",
                                            "src/seqlm/ngram/_dense.cpp"],
              depends=["src/seqlm/ngram/_buffers.h", "src/seqlm/ngram/_scorer.h", "src/seqlm/ngram/_state.h",
                       "src/seqlm/data/_utf8_space.h"], extra_compile_args=FLAGS, language="c++"),
    Extension("seqlm.data._seqlm_tokens", ["src/seqlm/data/_tokens.cpp"], depends=["src/seqlm/data/_utf8_space.h"],
              extra_compile_args=FLAGS,
              language="c++"),
    Extension("seqlm.decode._seqlm_decode", ["src/seqlm/decode/_search.cpp"], depends=["src/seqlm/decode/_tables.h"],
              extra_compile_args=FLAGS, language="c++"),
    Extension("seqlm.nn._seqlm_nn", ["src/seqlm/nn/_gather_dot.cpp"], depends=["src/seqlm/ngram/_buffers.h"],
              extra_compile_args=FLAGS, language="c++"),
]


class OptionalBuildExt(build_ext):
    """Build each module if a compiler can; without one, warn and install the pure-Python package."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 (setuptools raises several kinds when no compiler is found)
            warnings.warn(f"seqlm: compiled loops not built ({e}); the Python twins will run", stacklevel=1)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"seqlm: {ext.name} not built ({e}); its Python twin will run", stacklevel=1)


setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": OptionalBuildExt})
