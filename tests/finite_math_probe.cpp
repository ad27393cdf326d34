// Compiled (syntax only) by the finite_math_* tests with -ffinite-math-only / -ffast-math: the
// public header must refuse them (the NaN/Inf gradient checks would be folded away), and accept
// them, warning, with ZENFLOW_ALLOW_FINITE_MATH_ONLY.
#include <zenflow/zenflow.hpp>

int main() { return 0; }
