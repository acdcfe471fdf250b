"""Builds mlaconf.native._atb_harness; it needs only a C++17 compiler (libatb is dlopen'ed at run time)."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "mlaconf.native._atb_harness",
            ["native/src/atb_harness.cpp"],
            include_dirs=["native/src"],
            depends=["native/src/atb_abi.h"],
            cxx_std=17,
            extra_compile_args=["-Wall", "-Wextra"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": build_ext},
)
