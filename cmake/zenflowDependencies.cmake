# Host dependencies of zenflow, shared by the build tree and the installed package config.
include(CMakeFindDependencyMacro)
# oneTBB 2021 or newer. The version is checked here rather than asked of find_dependency: a
# package manager's generated TBB config may accept only its own major version (Conan's CMakeDeps
# writes SameMajorVersion files), which would refuse a oneTBB 2022 asked for as "2021".
find_dependency(TBB)
if(TBB_FOUND AND TBB_VERSION AND TBB_VERSION VERSION_LESS 2021)
  set(TBB_FOUND FALSE)
  if(CMAKE_FIND_PACKAGE_NAME)  # (in the installed package's config; the build tree stops below)
    set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE
        "${CMAKE_FIND_PACKAGE_NAME} needs oneTBB 2021 or newer; found TBB ${TBB_VERSION} (${TBB_DIR}; the first "
        "TBB found is the one used: point TBB_DIR at a newer one)")
    set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
    return()
  endif()
endif()
find_dependency(xsimd)
# Debian's xsimd config lists a bare "xtl" link item without finding xtl (and xtl is not a
# dependency of the package); xsimd itself does not need it. When xsimd names it and no xtl
# package can be found, an empty stand-in target keeps "-lxtl" off the link line. (Only then: a
# stand-in made where xtl is installed would stop the consumer's own find_package(xtl) from
# defining the real target.)
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_zf_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  list(FIND _zf_xsimd_links xtl _zf_xtl_at)
  if(NOT _zf_xtl_at EQUAL -1)
    find_package(xtl QUIET CONFIG)
    if(NOT TARGET xtl)
      add_library(xtl INTERFACE IMPORTED)
    endif()
  endif()
  unset(_zf_xsimd_links)
  unset(_zf_xtl_at)
endif()
