"""Builds mlaconf.native._atb_harness (libatb is dlopen'ed at run time) and mlaconf.golden.building._tile_kernel
(the golden's fused softmax passes); both need only a C++17 compiler."""

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
        ),
        Pybind11Extension(
            "mlaconf.golden.building._tile_kernel",
            ["golden/building/src/tile_kernel.cpp"],
            cxx_std=17,
            # -fopenmp-simd: the simd pragmas only (no OpenMP runtime); no -ffast-math, the float64 golden
            # keeps IEEE semantics (FMA contraction inside the exp polynomial is written out explicitly)
            extra_compile_args=["-Wall", "-Wextra", "-O3", "-fopenmp-simd", "-fno-math-errno", "-Wno-psabi"],
        ),
    ],
    cmdclass={"build_ext": build_ext},
)
