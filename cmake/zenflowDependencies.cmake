# Host dependencies of zenflow, shared by the build tree and the installed package config.
include(CMakeFindDependencyMacro)
find_dependency(TBB 2021)
# Debian's xsimd config lists a bare "xtl" link item without finding xtl (and xtl is not a
# dependency of the package); xsimd itself does not need it. An empty stand-in target keeps
# "-lxtl" off the link line. Harmless where xtl exists or is not referenced.
if(NOT TARGET xtl)
  add_library(xtl INTERFACE IMPORTED)
endif()
find_dependency(xsimd)
