// Independent, slow, obviously-correct references for the tests. Nothing here uses the library:
// rounding is done in double arithmetic from the definition of the formats, and AdamW follows
// the PyTorch formulas in double precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace zf_ref {

inline std::uint32_t bits(float x) { std::uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float from_bits(std::uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// ---- bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an IEEE float) ---------
inline double bf16_value(std::uint16_t h) { return double(from_bits(std::uint32_t(h) << 16)); }

// Round a finite float to the nearest bfloat16 (ties to even mantissa), by comparing the two
// neighbouring candidates in exact double arithmetic.
inline std::uint16_t bf16_round(float x) {
  const std::uint32_t u = bits(x);
  const std::uint16_t lo = std::uint16_t(u >> 16);  // truncation toward zero
  if ((u & 0xffffu) == 0) return lo;
  const std::uint16_t hi = std::uint16_t(lo + 1);  // next bf16 away from zero (may be inf)
  // IEEE rounds as if the exponent range were unbounded: the neighbour past the largest finite
  // value is 2^128, and a result rounded to it overflows to infinity.
  const double hv = (hi & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), double(x))
                                              : bf16_value(hi);
  const double dl = std::fabs(double(x) - bf16_value(lo));
  const double dh = std::fabs(hv - double(x));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

// ---- float16: 1 sign, 5 exponent, 10 mantissa bits -----------------------------------------
inline double f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? NAN : s * INFINITY;
  if (e == 0) return s * std::ldexp(double(m), -24);
  return s * std::ldexp(double(1024 + m), e - 25);
}

// Round a float to the nearest float16 (ties to even), directly from the definition: quantise
// |x| to the spacing of its binade with round-half-even, then encode. An infinity stays one and a
// NaN becomes the quiet NaN 0x7e00 with x's sign (frexp's exponent is unspecified for both).
inline std::uint16_t f16_round(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | 0x7c00;
  if (std::isnan(x)) return sign | 0x7e00;
  const double a = std::fabs(double(x));
  int e2;
  std::frexp(a, &e2);                   // a = f * 2^e2, f in [0.5, 1)
  const int exp = std::max(e2 - 1, -14);  // binade exponent; subnormals share 2^-14's spacing
  const double quantum = std::ldexp(1.0, exp - 10);
  const double q = std::nearbyint(a / quantum);  // default rounding mode: half to even
  const double r = q * quantum;
  if (r >= 65536.0) return sign | 0x7c00;  // rounds past the largest finite half (65504)
  if (r == 0) return sign;
  int re;
  std::frexp(r, &re);
  const int rexp = re - 1;
  if (rexp < -14) return std::uint16_t(sign | std::uint16_t(q));  // subnormal: q * 2^-24
  const int mant = int(std::ldexp(r, 10 - rexp)) - 1024;
  return std::uint16_t(sign | ((rexp + 15) << 10) | mant);
}

// ---- AdamW in double, PyTorch formulas (torch.optim.AdamW / Adam with weight_decay) ---------
struct adam_state { double p, m, v; };
inline adam_state adamw(adam_state s, double g, double lr, double b1, double b2, double eps,
                        double wd, bool decoupled, std::uint64_t n) {
  if (decoupled) s.p *= 1 - lr * wd;
  else g += wd * s.p;
  s.m = b1 * s.m + (1 - b1) * g;
  s.v = b2 * s.v + (1 - b2) * g * g;
  const double bc1 = 1 - std::pow(b1, double(n)), bc2 = 1 - std::pow(b2, double(n));
  s.p -= lr / bc1 * s.m / (std::sqrt(s.v) / std::sqrt(bc2) + eps);
  return s;
}

// ---- top-k selection: the k columns with the largest scores, ties to the lower index ----------
// Column c is selected when fewer than k columns beat it (a larger score, or an equal one at a
// lower index): quadratic, no sorting. The result is ascending by construction.
inline std::vector<std::uint32_t> topk_columns(const double* scores, std::size_t cols, std::size_t k) {
  std::vector<std::uint32_t> out;
  for (std::size_t c = 0; c < cols; ++c) {
    std::size_t beaten_by = 0;
    for (std::size_t o = 0; o < cols; ++o)
      if (scores[o] > scores[c] || (scores[o] == scores[c] && o < c)) ++beaten_by;
    if (beaten_by < k) out.push_back(std::uint32_t(c));
  }
  return out;
}

}  // namespace zf_ref
