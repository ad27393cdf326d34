# xsimd as the system has it (Debian's libxsimd-dev, headers only), for a Conan cache that cannot
# download: the package holds nothing; CMakeDeps makes the xsimd target find_package(xsimd)
# gives. A test-only stand-in for the ConanCenter recipe (same name and version).
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class SystemXsimd(ConanFile):
    name = "xsimd"
    version = "8.1.0"
    description = "xsimd from the system package manager (wrapper)"
    package_type = "header-library"

    def validate(self):
        if not os.path.exists("/usr/include/xsimd/xsimd.hpp"):
            raise ConanInvalidConfiguration("xsimd headers not found: install libxsimd-dev (cmake/install_dependencies.sh)")

    def package_id(self):
        self.info.clear()

    def package_info(self):
        self.cpp_info.includedirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.bindirs = []
        self.cpp_info.set_property("cmake_file_name", "xsimd")
        self.cpp_info.set_property("cmake_target_name", "xsimd")
