# oneTBB as the system has it (Debian's libtbb-dev), for a Conan cache that cannot download:
# the package holds nothing; it tells consumers to link the system's libtbb, and CMakeDeps makes
# the TBB::tbb target that find_package(TBB) gives. A test-only stand-in for the ConanCenter
# recipe: with network access, use that one (same name and version).
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration


class SystemOneTBB(ConanFile):
    name = "onetbb"
    version = "2021.8.0"
    description = "oneTBB from the system package manager (wrapper)"
    settings = "os", "arch"
    package_type = "shared-library"

    def validate(self):
        if not os.path.exists("/usr/include/oneapi/tbb.h"):
            raise ConanInvalidConfiguration("oneTBB headers not found: install libtbb-dev (cmake/install_dependencies.sh)")

    def package_info(self):
        self.cpp_info.includedirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.bindirs = []
        self.cpp_info.system_libs = ["tbb"]
        self.cpp_info.set_property("cmake_file_name", "TBB")
        self.cpp_info.set_property("cmake_target_name", "TBB::tbb")
