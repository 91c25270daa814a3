"""Build configuration beyond pyproject.toml: two optional C modules.

``commscope.analyze.read._fastread`` reads flight-recorder dump pickles straight into
columns (about 2x faster loading). It is optional: without a C compiler the build
goes on without it and the analyzer uses the standard unpickler, with the same results.

``commscope.flight.record._stack`` walks the Python stack for the flight recorder in one C
call (Python 3.11+). Also optional: without it the recorder walks the stack in Python,
with the same result, about 1.5 us slower per collective.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "commscope.analyze.read._fastread",
            ["commscope/analyze/read/_fastread.c"],
            optional=True,
        ),
        Extension(
            "commscope.flight.record._stack",
            ["commscope/flight/record/_stack.c"],
            optional=True,
        ),
    ]
)
