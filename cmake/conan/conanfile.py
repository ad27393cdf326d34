# Conan 2 recipe of zenflow. The sources are the repository this file lives in (cmake/conan/),
# exported from two levels up; the version is read from include/zenflow/version.hpp.
#
#   conan create cmake/conan -s compiler.cppstd=20 --build=missing
#
# Options: header_only (the headers alone, no compiled host-kernel dispatch library: the kernels
# are then compiled for the consumer's own -march), cuda (also install zenflow::cuda; needs nvcc).
# Without header_only the package carries zenflow's own CMake config (find_package(zenflow
# CONFIG) with targets zenflow::zenflow, zenflow::c, zenflow::cuda), which finds oneTBB and xsimd
# through the config files Conan generates for those requirements.
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load


class ZenflowConan(ConanFile):
    name = "zenflow"
    description = "ZenFlow, the stall-free offloading optimizer: a header-only C++20/CUDA library"
    topics = ("optimizer", "adamw", "offloading", "cuda", "deep-learning")
    settings = "os", "arch", "compiler", "build_type"
    options = {"header_only": [True, False], "cuda": [True, False]}
    default_options = {"header_only": False, "cuda": False}

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "..", "..", "include", "zenflow", "version.hpp"))
        parts = [re.search(r"#define ZENFLOW_VERSION_%s (\d+)" % p, text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def export_sources(self):
        root = os.path.join(self.recipe_folder, "..", "..")
        for pattern in ("CMakeLists.txt", "include/*", "cmake/*.cmake", "cmake/*.in", "cmake/*.sh"):
            copy(self, pattern, src=root, dst=self.export_sources_folder)

    def configure(self):
        if self.options.header_only:
            self.options.rm_safe("cuda")  # the headers are the same; zenflow::cuda is a CMake target

    def requirements(self):
        self.requires("onetbb/2021.8.0", transitive_headers=True, transitive_libs=True)
        self.requires("xsimd/8.1.0", transitive_headers=True)

    def package_id(self):
        if self.info.options.header_only:
            self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        if self.options.header_only:
            return
        tc = CMakeToolchain(self)
        for opt in ("ZENFLOW_BUILD_TESTS", "ZENFLOW_BUILD_BENCH", "ZENFLOW_BUILD_EXAMPLES"):
            tc.cache_variables[opt] = False
        tc.cache_variables["ZENFLOW_INSTALL"] = True
        tc.cache_variables["ZENFLOW_ENABLE_CUDA"] = bool(self.options.cuda)
        # (not whatever MPI or NCCL the build machine happens to have: the package declares neither)
        tc.cache_variables["ZENFLOW_ENABLE_MPI"] = False
        tc.cache_variables["ZENFLOW_ENABLE_NCCL"] = False
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        if self.options.header_only:
            return
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def package(self):
        if self.options.header_only:
            copy(self, "*", src=os.path.join(self.source_folder, "include"), dst=os.path.join(self.package_folder, "include"))
            return
        CMake(self).install()

    def package_info(self):
        if self.options.header_only:
            self.cpp_info.bindirs = []
            self.cpp_info.libdirs = []
            self.cpp_info.set_property("cmake_file_name", "zenflow")
            self.cpp_info.set_property("cmake_target_name", "zenflow::zenflow")
            self.cpp_info.requires = ["onetbb::onetbb", "xsimd::xsimd"]
            return
        # zenflow's own config file (lib/cmake/zenflow), found through builddirs; for other
        # generators (pkg-config, Make), the same libraries and define
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = [os.path.join("lib", "cmake", "zenflow")]
        self.cpp_info.libs = ["zenflow_c", "zenflow_host_kernels"]
        self.cpp_info.defines = ["ZENFLOW_HOST_DISPATCH"]
        self.cpp_info.requires = ["onetbb::onetbb", "xsimd::xsimd"]
