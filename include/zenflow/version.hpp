// zenflow's version, for code that needs to test it. The one place it is written down: CMake's
// project() reads it from here, the package files and recipes take it from CMake, and a test
// checks that the installed pkg-config file agrees.
#pragma once

#define ZENFLOW_VERSION_MAJOR 0
#define ZENFLOW_VERSION_MINOR 1
#define ZENFLOW_VERSION_PATCH 0
// major * 10000 + minor * 100 + patch, for #if comparisons
#define ZENFLOW_VERSION (ZENFLOW_VERSION_MAJOR * 10000 + ZENFLOW_VERSION_MINOR * 100 + ZENFLOW_VERSION_PATCH)
