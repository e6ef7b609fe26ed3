"""Builds the kp extension with the repository's CMake build (see pyproject.toml)."""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    """Configures the repository for this interpreter, builds the _kp target and copies the module
    and komputed's shared libraries (which the module finds beside itself) into the package."""

    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build, exist_ok=True)
        configure = [
            "cmake", "-S", ROOT, "-B", build,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DKOMPUTED_BUILD_TESTS=OFF",
            # The module's and the library's run paths are those of an installed package.
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        ]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", build, "--target", "_kp"], check=True)

        package = os.path.join(os.path.abspath(self.build_lib), "kp")
        os.makedirs(package, exist_ok=True)
        module = glob.glob(os.path.join(build, "python", "kp", "_kp*.so"))
        if len(module) != 1:
            raise RuntimeError(f"the CMake build made {module!r}, not one kp module")
        shutil.copy2(module[0], self.get_ext_fullpath(ext.name))
        # komputed's shared libraries (kp's and the wire API's) under their sonames, which the
        # module and the kp library name; both look beside themselves ($ORIGIN).
        libraries = glob.glob(os.path.join(build, "*", "libkomputed_*.so.[0-9]"))
        if not libraries:
            raise RuntimeError(f"no komputed shared libraries in {build}")
        for library in libraries:
            shutil.copy2(os.path.realpath(library),
                         os.path.join(package, os.path.basename(library)))


setup(
    ext_modules=[Extension("kp._kp", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
