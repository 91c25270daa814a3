"""Build configuration beyond pyproject.toml: the optional C reader of the analyzer.

``commscope.analyze._fastread`` reads flight-recorder dump pickles straight into
columns (about 2x faster loading). It is optional: without a C compiler the build
goes on without it and the analyzer uses the standard unpickler, with the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "commscope.analyze._fastread",
            ["commscope/analyze/_fastread.c"],
            optional=True,
        )
    ]
)
