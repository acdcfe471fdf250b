// Fused softmax steps of the golden generator's attention tiles (mlaconf.golden.building._tile_kernel).
//
// The GEMMs stay in BLAS (torch's MKL); between them a tile of scores [rows, cols] is turned into
// unnormalised probabilities in one pass per row while the row sits in L1/L2: causal mask,
// row max and min, exp(s - max), the row sums of P and P^2, and (for the magnitudes' float32
// GEMMs) P and P^2 rounded up to float32 and floored (mlaconf.golden.building.magnitudes says why).  numpy
// needs four to six passes over the tile in memory for the same work, and its float64 exp is scalar
// libm.  The emulated baseline's float32 tiles get one such pass too (baseline_softmax_tile: scale,
// mask, max, exp, row sum, P rounded to bf16 / fp16).
//
// exp is our own: Cody-Waite reduction by ln 2 and a degree-13 Taylor polynomial on |r| <= ln2/2
// (truncation below 2^-60 relative), evaluated with FMA, scaled by 2^n in two steps so gradual
// underflow rounds once.  Error a little over 1 ulp, branch-free, so the compiler vectorises it;
// a variant per target (AVX-512, AVX2+FMA, baseline) is picked at load time.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Helpers are inlined into each target variant below, so their vectors never cross a call boundary.
#define MLA_INLINE inline __attribute__((always_inline))

// Eight doubles in GCC's generic vectors: each target_clones variant lowers them to its own
// registers (one zmm, two ymm, four xmm), and a*b+c contracts to FMA where the target has it.
typedef double v8d __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

MLA_INLINE double as_double(int64_t bits) {
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
}
MLA_INLINE int64_t as_bits(double d) {
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    return bits;
}
MLA_INLINE v8d as_double(v8l bits) { return reinterpret_cast<v8d>(bits); }
MLA_INLINE v8l as_bits(v8d d) { return reinterpret_cast<v8l>(d); }
MLA_INLINE double clamp_low(double x) { return x < -746.0 ? -746.0 : x; }
MLA_INLINE v8d clamp_low(v8d x) { return x < -746.0 ? v8d{} - 746.0 : x; }

// e^x for x <= 0 (x = -inf gives 0); the callers only pass score - row max.  T is double or v8d.
template <typename T, typename I>
MLA_INLINE T exp_nonpositive(T x) {
    constexpr double kLog2e = 1.4426950408889634;
    constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 with 21 trailing zero bits: n * kLn2Hi is exact
    constexpr double kLn2Lo = 1.90821492927058770002e-10;
    constexpr double kShifter = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer (ties even)
    x = clamp_low(x);                                // exp(-746) rounds to 0; also maps -inf there
    const T shifted = x * kLog2e + kShifter;
    const T n = shifted - kShifter;
    const T r = (x - n * kLn2Hi) - n * kLn2Lo;
    T p = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;  // Taylor to r^13 / 13!
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // n sits in the low bits of `shifted`; 2^n = 2^half * 2^(n - half), both normal for n >= -1077,
    // so p * 2^half is exact and gradual underflow rounds once, in the second product.
    const I k = (as_bits(shifted) << 12) >> 12;  // sign-extend the 52-bit field holding n
    const I half = k >> 1;
    return p * as_double((half + 1023) << 52) * as_double((k - half + 1023) << 52);
}

// The smallest float32 not below the non-negative double v (and > 0 whenever v > 0).
MLA_INLINE float round_up_f32(double v) {
    float f = static_cast<float>(v);
    if (static_cast<double>(f) < v) {
        f = std::nextafter(f, std::numeric_limits<float>::infinity());
    }
    return f;
}

// The same for eight lanes, as float32 bit patterns: one ulp up (bits + 1) where the nearest is below.
MLA_INLINE v8i round_up_f32(v8d v) {
    const v8f nearest = __builtin_convertvector(v, v8f);
    const v8i below = __builtin_convertvector(__builtin_convertvector(nearest, v8d) < v, v8i);  // -1 or 0
    return reinterpret_cast<v8i>(nearest) - below;
}

struct RowStats {
    double max, min, sum, sumsq;
};

MLA_INLINE RowStats softmax_row_body(double *s, int64_t allowed, int64_t cols, float *p32, float *p2_32,
                                     float floor, double *raw) {
    int32_t floor_scalar_bits;
    std::memcpy(&floor_scalar_bits, &floor, sizeof floor_scalar_bits);
    const v8i floor_bits = v8i{} + floor_scalar_bits;
    double mx = -std::numeric_limits<double>::infinity();
    double mn = std::numeric_limits<double>::infinity();
#pragma omp simd reduction(max : mx) reduction(min : mn)
    for (int64_t j = 0; j < allowed; ++j) {
        mx = s[j] > mx ? s[j] : mx;
        mn = s[j] < mn ? s[j] : mn;
    }
    if (raw != nullptr) {  // the scores before the softmax, masked keys 0 (what T and S read)
        std::memcpy(raw, s, sizeof(double) * static_cast<size_t>(allowed));
        std::fill(raw + allowed, raw + cols, 0.0);
    }
    v8d vsum{}, vsumsq{};
    int64_t j = 0;
    for (; j + 8 <= allowed; j += 8) {
        v8d x;
        std::memcpy(&x, s + j, sizeof x);
        const v8d e = exp_nonpositive<v8d, v8l>(x - mx);
        std::memcpy(s + j, &e, sizeof e);
        vsum += e;
        vsumsq += e * e;
    }
    double sum = 0.0, sumsq = 0.0;
    for (int lane = 0; lane < 8; ++lane) {
        sum += vsum[lane];
        sumsq += vsumsq[lane];
    }
    for (; j < allowed; ++j) {
        const double e = exp_nonpositive<double, int64_t>(s[j] - mx);
        s[j] = e;
        sum += e;
        sumsq += e * e;
    }
    for (int64_t j = allowed; j < cols; ++j) {
        s[j] = 0.0;
    }
    if (p32 != nullptr) {
        int64_t i = 0;
        for (; i + 8 <= allowed; i += 8) {
            v8d e;
            std::memcpy(&e, s + i, sizeof e);
            const v8i up = round_up_f32(e);
            const v8i up2 = round_up_f32(e * e);
            const v8i p = up > floor_bits ? up : floor_bits;  // positive floats order like their bits
            const v8i p2 = up2 > floor_bits ? up2 : floor_bits;
            std::memcpy(p32 + i, &p, sizeof p);
            std::memcpy(p2_32 + i, &p2, sizeof p2);
        }
        for (; i < allowed; ++i) {
            p32[i] = std::max(round_up_f32(s[i]), floor);
            p2_32[i] = std::max(round_up_f32(s[i] * s[i]), floor);
        }
        for (; i < cols; ++i) {
            p32[i] = 0.0f;
            p2_32[i] = 0.0f;
        }
    }
    return {mx, mn, sum, sumsq};
}

using RowKernel = RowStats (*)(double *, int64_t, int64_t, float *, float *, float, double *);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) RowStats softmax_row_avx512(
    double *s, int64_t allowed, int64_t cols, float *p32, float *p2_32, float floor, double *raw) {
    return softmax_row_body(s, allowed, cols, p32, p2_32, floor, raw);
}
__attribute__((target("avx2,fma"))) RowStats softmax_row_avx2(double *s, int64_t allowed, int64_t cols, float *p32,
                                                               float *p2_32, float floor, double *raw) {
    return softmax_row_body(s, allowed, cols, p32, p2_32, floor, raw);
}
#endif
RowStats softmax_row_baseline(double *s, int64_t allowed, int64_t cols, float *p32, float *p2_32, float floor,
                              double *raw) {
    return softmax_row_body(s, allowed, cols, p32, p2_32, floor, raw);
}

// The widest instruction set this CPU runs, for choosing each kernel's variant once (GCC's
// target_clones does not dispatch static functions).
enum class Isa { baseline, avx2, avx512 };

Isa widest_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")) {
        return Isa::avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return Isa::avx2;
    }
#endif
    return Isa::baseline;
}

RowKernel pick_row_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (widest_isa()) {
    case Isa::avx512: return softmax_row_avx512;
    case Isa::avx2: return softmax_row_avx2;
    case Isa::baseline: break;
    }
#endif
    return softmax_row_baseline;
}

const RowKernel softmax_row = pick_row_kernel();

// The emulated baseline's fp32 score path (mlaconf.golden.building.baseline) for one row: scale the fp32 scores,
// row max, e = exp(s - max) rounded to float32 (our float64 exp, then one rounding), their sum (float64
// lanes, rounded once to float32: within half an ulp of the exact sum of the float32 e, as numpy's pairwise
// float32 sum is within a few), and e rounded to the input dtype in place, where the kernel's P.V reads it.
enum class Rounding { bf16 = 0, fp16_flushed = 1 };

// float32 -> bf16 (nearest even), kept as float32 bits: half an ulp (minus one when the kept bit is even).
MLA_INLINE v8i round_bits_bf16(v8i bits) { return (bits + 0x7FFF + ((bits >> 16) & 1)) & ~0xFFFF; }
MLA_INLINE int32_t round_bits_bf16(int32_t bits) { return (bits + 0x7FFF + ((bits >> 16) & 1)) & ~0xFFFF; }

// e in [0, 1] -> nearest fp16 (even), kept as float32 bits, 0 where that is below fp16's smallest normal
// 2^-14 (a flush-to-zero device's P): from 2^-14 - 2^-25 (the midpoint below 2^-14, which ties to it) up to
// 2^-14 the result is 2^-14; from 2^-14 on fp16 keeps float32's top 10 mantissa bits.
constexpr int32_t kFp16MinNormalBits = 0x38800000;   // 2^-14
constexpr int32_t kFp16FlushBelowBits = 0x387FE000;  // 2^-14 - 2^-25
MLA_INLINE v8i round_bits_fp16(v8i bits) {
    const v8i normal = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF;
    const v8i low = bits >= kFp16FlushBelowBits ? v8i{} + kFp16MinNormalBits : v8i{};
    return bits >= kFp16MinNormalBits ? normal : low;
}
MLA_INLINE int32_t round_bits_fp16(int32_t bits) {
    if (bits >= kFp16MinNormalBits) {
        return (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF;
    }
    return bits >= kFp16FlushBelowBits ? kFp16MinNormalBits : 0;
}

MLA_INLINE float baseline_row_body(float *s, int64_t allowed, int64_t cols, float scale, Rounding rounding) {
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < allowed; ++j) {
        s[j] *= scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    v8d lo{}, hi{};
    int64_t j = 0;
    for (; j + 16 <= allowed; j += 16) {
        v8f x[2];
        std::memcpy(x, s + j, sizeof x);
        const v8f e0 = __builtin_convertvector(
            exp_nonpositive<v8d, v8l>(__builtin_convertvector(x[0] - mx, v8d)), v8f);
        const v8f e1 = __builtin_convertvector(
            exp_nonpositive<v8d, v8l>(__builtin_convertvector(x[1] - mx, v8d)), v8f);
        lo += __builtin_convertvector(e0, v8d);
        hi += __builtin_convertvector(e1, v8d);
        v8i bits[2] = {reinterpret_cast<v8i>(e0), reinterpret_cast<v8i>(e1)};
        for (v8i &b : bits) {
            b = rounding == Rounding::bf16 ? round_bits_bf16(b) : round_bits_fp16(b);
        }
        std::memcpy(s + j, bits, sizeof bits);
    }
    double sum = 0.0;
    const v8d lanes = lo + hi;
    for (int lane = 0; lane < 8; ++lane) {
        sum += lanes[lane];
    }
    for (; j < allowed; ++j) {
        const float e = static_cast<float>(exp_nonpositive<double, int64_t>(static_cast<double>(s[j] - mx)));
        sum += e;
        int32_t bits;
        std::memcpy(&bits, &e, sizeof bits);
        bits = rounding == Rounding::bf16 ? round_bits_bf16(bits) : round_bits_fp16(bits);
        std::memcpy(s + j, &bits, sizeof bits);
    }
    for (int64_t k = allowed; k < cols; ++k) {
        s[k] = 0.0f;
    }
    return static_cast<float>(sum);
}

using BaselineRowKernel = float (*)(float *, int64_t, int64_t, float, Rounding);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) float baseline_row_avx512(
    float *s, int64_t allowed, int64_t cols, float scale, Rounding rounding) {
    return baseline_row_body(s, allowed, cols, scale, rounding);
}
__attribute__((target("avx2,fma"))) float baseline_row_avx2(float *s, int64_t allowed, int64_t cols, float scale,
                                                             Rounding rounding) {
    return baseline_row_body(s, allowed, cols, scale, rounding);
}
#endif
float baseline_row_baseline(float *s, int64_t allowed, int64_t cols, float scale, Rounding rounding) {
    return baseline_row_body(s, allowed, cols, scale, rounding);
}

BaselineRowKernel pick_baseline_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (widest_isa()) {
    case Isa::avx512: return baseline_row_avx512;
    case Isa::avx2: return baseline_row_avx2;
    case Isa::baseline: break;
    }
#endif
    return baseline_row_baseline;
}

const BaselineRowKernel baseline_row = pick_baseline_kernel();

template <typename T>
T *writable(py::array_t<T> &a, const char *name, int64_t rows, int64_t cols) {
    if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols) {
        throw std::invalid_argument(std::string(name) + " must be [rows, cols] like scores");
    }
    if (!(a.flags() & py::array::c_style) || !a.writeable()) {
        throw std::invalid_argument(std::string(name) + " must be C-contiguous and writable");
    }
    return a.mutable_data();
}

template <typename T>
T *row_vector(py::array_t<T> &a, const char *name, int64_t rows) {
    if (a.ndim() != 1 || a.shape(0) != rows || !(a.flags() & py::array::c_style) || !a.writeable()) {
        throw std::invalid_argument(std::string(name) + " must be a writable C-contiguous [rows] array");
    }
    return a.mutable_data();
}

// Row r's allowed keys: all cols without a causal offset, else min(cols, first + r + 1), at least 0.
int64_t allowed_keys(bool is_causal, int64_t first, int64_t r, int64_t cols) {
    if (!is_causal) {
        return cols;
    }
    const int64_t last = first + r;  // last allowed key of row r
    return last + 1 < cols ? (last + 1 > 0 ? last + 1 : 0) : cols;
}

// One row of T's products: ps = (p / denom) * raw, rounded as numpy's separate divide and multiply round them
// (two roundings, no contraction: there is no add), and the row sums of |ps| and of ps (float64 lanes: within
// T's guard of (keys + 4) eps64, which bounds any order).  One out-of-line definition, so every row sums alike.
__attribute__((noinline)) void scaled_row(const double *p, double denom, const double *raw, double *out, int64_t cols,
                                          double *abs_sum, double *sum) {
    double total_abs = 0.0, total = 0.0;
#pragma omp simd reduction(+ : total_abs, total)
    for (int64_t j = 0; j < cols; ++j) {
        const double value = (p[j] / denom) * raw[j];
        out[j] = value;
        total_abs += std::fabs(value);
        total += value;
    }
    *abs_sum = total_abs;
    *sum = total;
}

// In place: scores [rows, cols] -> e^(s - row max) on the allowed keys, 0 on masked ones.
// Row r may see keys j < allowed(r): cols without a causal offset, else min(cols, first + r + 1)
// with first = row0 + offset.  stats [4, rows] receives max, min, sum P, sum P^2 per row; raw (optional)
// a copy of the scores before the softmax with masked keys 0; ps (optional, with ps_sums [2, rows]) T's products
// (P / sum P) s and their row sums of |.| and of them (scaled_row), made while the row is in cache: the raw
// scores then need no tile-sized copy unless raw is asked for too.
void softmax_tile(py::array_t<double> scores, py::array_t<double> stats, py::object causal, py::object p32_obj,
                  py::object p2_obj, float floor, py::object raw_obj, py::object ps_obj, py::object ps_sums_obj,
                  py::object counts_obj) {
    if (!(floor > 0.0f) || !std::isnormal(floor)) {
        throw std::invalid_argument("floor must be a positive normal float32");
    }
    if (scores.ndim() != 2) {
        throw std::invalid_argument("scores must be a 2-D float64 array");
    }
    const int64_t rows = scores.shape(0), cols = scores.shape(1);
    double *s = writable(scores, "scores", rows, cols);
    if (stats.ndim() != 2 || stats.shape(0) != 4 || stats.shape(1) != rows || !(stats.flags() & py::array::c_style)) {
        throw std::invalid_argument("stats must be a C-contiguous [4, rows] float64 array");
    }
    double *st = stats.mutable_data();
    int64_t first = -1;
    const bool is_causal = !causal.is_none();
    if (is_causal) {
        first = causal.cast<int64_t>();
    }
    float *p32 = nullptr, *p2 = nullptr;
    py::array_t<float> p32_arr, p2_arr;
    if (!p32_obj.is_none()) {
        p32_arr = p32_obj.cast<py::array_t<float>>();
        p2_arr = p2_obj.cast<py::array_t<float>>();
        p32 = writable(p32_arr, "p32", rows, cols);
        p2 = writable(p2_arr, "p2_32", rows, cols);
    }
    double *raw = nullptr;
    py::array_t<double> raw_arr;
    if (!raw_obj.is_none()) {
        raw_arr = raw_obj.cast<py::array_t<double>>();
        raw = writable(raw_arr, "raw", rows, cols);
    }
    double *ps = nullptr, *ps_sums = nullptr;
    py::array_t<double> ps_arr, ps_sums_arr;
    if (ps_obj.is_none() != ps_sums_obj.is_none()) {
        throw std::invalid_argument("ps and ps_sums come together");
    }
    if (!ps_obj.is_none()) {
        ps_arr = ps_obj.cast<py::array_t<double>>();
        ps_sums_arr = ps_sums_obj.cast<py::array_t<double>>();
        ps = writable(ps_arr, "ps", rows, cols);
        if (ps_sums_arr.ndim() != 2 || ps_sums_arr.shape(0) != 2 || ps_sums_arr.shape(1) != rows ||
            !(ps_sums_arr.flags() & py::array::c_style) || !ps_sums_arr.writeable()) {
            throw std::invalid_argument("ps_sums must be a writable C-contiguous [2, rows] float64 array");
        }
        ps_sums = ps_sums_arr.mutable_data();
    }
    const int64_t *counts = nullptr;
    py::array_t<int64_t, py::array::c_style> counts_arr;
    if (!counts_obj.is_none()) {
        if (is_causal) {
            throw std::invalid_argument("counts replace the causal offset: give one of them");
        }
        counts_arr = counts_obj.cast<py::array_t<int64_t, py::array::c_style>>();
        if (counts_arr.ndim() != 1 || counts_arr.shape(0) != rows) {
            throw std::invalid_argument("counts must be an int64 [rows] array");
        }
        counts = counts_arr.data();
        for (int64_t r = 0; r < rows; ++r) {
            if (counts[r] < 0 || counts[r] > cols) {
                throw std::invalid_argument("counts must lie in [0, cols]");
            }
        }
    }
    {
        py::gil_scoped_release release;
        std::vector<double> row_raw(raw == nullptr && ps != nullptr ? static_cast<size_t>(cols) : 0);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t allowed = counts != nullptr ? counts[r] : allowed_keys(is_causal, first, r, cols);
            double *raw_r = raw != nullptr ? raw + r * cols : (ps != nullptr ? row_raw.data() : nullptr);
            const RowStats row = softmax_row(s + r * cols, allowed, cols, p32 ? p32 + r * cols : nullptr,
                                             p2 ? p2 + r * cols : nullptr, floor, raw_r);
            st[r] = row.max;
            st[rows + r] = row.min;
            st[2 * rows + r] = row.sum;
            st[3 * rows + r] = row.sumsq;
            if (ps != nullptr && counts != nullptr) {  // a row's own keys only: its sums never see the width
                scaled_row(s + r * cols, row.sum, raw_r, ps + r * cols, allowed, ps_sums + r, ps_sums + rows + r);
                std::fill(ps + r * cols + allowed, ps + (r + 1) * cols, 0.0);
            } else if (ps != nullptr) {
                scaled_row(s + r * cols, row.sum, raw_r, ps + r * cols, cols, ps_sums + r, ps_sums + rows + r);
            }
        }
    }
}

// In place: float32 scores [rows, cols] -> P rounded to the input dtype (bf16, or fp16 with subnormals
// flushed) on the allowed keys, 0 on masked ones; denom [rows] receives the float32 sums of the unrounded P.
void baseline_softmax_tile(py::array_t<float> scores, py::array_t<float> denom, float scale, py::object causal,
                           const std::string &dtype) {
    Rounding rounding;
    if (dtype == "bf16") {
        rounding = Rounding::bf16;
    } else if (dtype == "fp16") {
        rounding = Rounding::fp16_flushed;
    } else {
        throw std::invalid_argument("dtype must be 'bf16' or 'fp16', got '" + dtype + "'");
    }
    if (scores.ndim() != 2) {
        throw std::invalid_argument("scores must be a 2-D float32 array");
    }
    const int64_t rows = scores.shape(0), cols = scores.shape(1);
    float *s = writable(scores, "scores", rows, cols);
    float *d = row_vector(denom, "denom", rows);
    const bool is_causal = !causal.is_none();
    const int64_t first = is_causal ? causal.cast<int64_t>() : -1;
    py::gil_scoped_release release;
    for (int64_t r = 0; r < rows; ++r) {
        d[r] = baseline_row(s + r * cols, allowed_keys(is_causal, first, r, cols), cols, scale, rounding);
    }
}

// float64 -> bf16 bits rounded away from zero (mlaconf.golden.building.magnitudes.round_up_bf16, the same steps): the
// nearest float32 of |v|, its upper 16 bits, one bf16 ulp up when bits were dropped or the float32 fell below.
MLA_INLINE uint16_t round_up_bf16_bits(double v) {
    const double mag = std::fabs(v);
    const float nearest = static_cast<float>(mag);
    uint32_t bits;
    std::memcpy(&bits, &nearest, sizeof bits);
    const uint32_t bump = ((bits & 0xFFFFu) != 0) | (static_cast<double>(nearest) < mag);
    const uint32_t upper = (bits >> 16) + bump;
    return static_cast<uint16_t>(upper | (static_cast<uint32_t>(std::signbit(v)) << 15));
}

MLA_INLINE double nan_min(double a, double b) { return (std::isnan(a) || a <= b) ? a : b; }  // as np.minimum

// A [rows, cols] float view with any strides (in elements).
template <typename T>
struct Strided {
    T *data;
    int64_t row, col;
    T &at(int64_t r, int64_t c) const { return data[r * row + c * col]; }
};

template <typename T, int Flags>
Strided<T> strided(py::array_t<T, Flags> &a, const char *name, int64_t rows, int64_t cols) {
    if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols) {
        throw std::invalid_argument(std::string(name) + " must be [rows, 128] like the tile's output");
    }
    return {a.mutable_data(), a.strides(0) / static_cast<int64_t>(sizeof(T)),
            a.strides(1) / static_cast<int64_t>(sizeof(T))};
}

// The magnitudes' element finish of one tile (mlaconf.golden.building.magnitudes.fused_tile), straight into the stored
// bf16 bits: pv_abs and pv_rss from the float32 GEMM sums lifted ((sum + add) * factor, lift_float32_sum), times
// the column scale, over the row sum, capped; pv_scale = T moved away from zero by its guard
// (scale_derivative).  Each value rounds as numpy's separate operations round it (no contraction: the
// build's bits must not depend on which path computed them), then rounds up to bf16 (round_up_bf16).
__attribute__((optimize("fp-contract=off"))) void finish_magnitudes(
    py::array_t<float> abs_sum, py::array_t<float> sq_sum, py::array_t<double> psv, py::array_t<double> golden,
    py::array_t<double> denom, py::array_t<double> ps_sums, py::array_t<double> scale, py::array_t<double> cap,
    py::array_t<double> vmax, double add, double factor, double gamma, py::object abs_out, py::object rss_out,
    py::object scale_out) {
    for (const py::object &out : {abs_out, rss_out, scale_out}) {  // a converted copy would drop the writes
        if (!py::isinstance<py::array_t<uint16_t>>(out) || !out.cast<py::array>().writeable()) {
            throw std::invalid_argument("pv_abs, pv_rss and pv_scale must be writable uint16 arrays (bf16 bits)");
        }
    }
    auto pv_abs = abs_out.cast<py::array_t<uint16_t>>(), pv_rss = rss_out.cast<py::array_t<uint16_t>>();
    auto pv_scale = scale_out.cast<py::array_t<uint16_t>>();
    if (golden.ndim() != 2) {
        throw std::invalid_argument("golden must be a 2-D float64 array");
    }
    const int64_t rows = golden.shape(0), cols = golden.shape(1);
    const auto a = strided(abs_sum, "abs_sum", rows, cols), q = strided(sq_sum, "sq_sum", rows, cols);
    const auto t = strided(psv, "psv", rows, cols), g = strided(golden, "golden", rows, cols);
    const auto oa = strided(pv_abs, "pv_abs", rows, cols), orss = strided(pv_rss, "pv_rss", rows, cols);
    const auto os = strided(pv_scale, "pv_scale", rows, cols);
    const auto sums = strided(ps_sums, "ps_sums", 2, rows);
    const double *d = row_vector(denom, "denom", rows);
    const double *sc = row_vector(scale, "scale", cols), *cp = row_vector(cap, "cap", cols);
    const double *vm = row_vector(vmax, "vmax", cols);
    py::gil_scoped_release release;
    for (int64_t r = 0; r < rows; ++r) {
        const double dr = d[r], ps_abs = sums.at(0, r), ps_sum = sums.at(1, r);
        for (int64_t c = 0; c < cols; ++c) {
            const double lifted_abs = (static_cast<double>(a.at(r, c)) + add) * factor;
            oa.at(r, c) = round_up_bf16_bits(nan_min(lifted_abs * sc[c] / dr, cp[c]));
            const double lifted_sq = (static_cast<double>(q.at(r, c)) + add) * factor;
            orss.at(r, c) = round_up_bf16_bits(nan_min(std::sqrt(lifted_sq) * sc[c] / dr, cp[c]));
            const double gv = g.at(r, c);
            const double value = t.at(r, c) - ps_sum * gv;
            const double guard = gamma * (ps_abs * vm[c] + std::fabs(gv * ps_sum));
            os.at(r, c) = round_up_bf16_bits(value + std::copysign(guard, value));
        }
    }
}

// Row-independent products for sampled goldens (mlaconf.golden.building.rows): every output element is one
// sum in one fixed order, ascending over the reduced index, one multiply-add per term (contracted to FMA
// where the target has it), computed by the same code whichever rows share the call.  BLAS decides its
// summation by the matrix shapes (a row of a 3-row GEMM differs from the same row in a 512-row one), so
// a row of a sample would not equal the row of a full golden; these kernels make it equal by construction.
// Rows come in blocks of kRowBlock (the callers pad), scores in blocks of 16 keys, weighted columns in vectors of 8.
constexpr int64_t kRowBlock = 4;
constexpr int64_t kKeyBlock = 256;  // keys per pass: a [192, 256] block of kt (384 kB) stays in L2

// kp holds K in panels of 16 keys, [panel][d][16] (contiguous along d): the micro-kernel streams one panel.
MLA_INLINE void row_scores_body(const double *q, int64_t rows, int64_t dim, const double *kp, int64_t cols,
                                double *out) {
    for (int64_t j0 = 0; j0 < cols; j0 += kKeyBlock) {
        const int64_t j1 = std::min(cols, j0 + kKeyBlock);
        for (int64_t r = 0; r < rows; r += kRowBlock) {
            const double *qr = q + r * dim;
            for (int64_t j = j0; j < j1; j += 16) {  // 4 rows x 16 keys in registers; d ascending for each
                const double *panel = kp + (j / 16) * dim * 16;
                v8d lo[kRowBlock] = {}, hi[kRowBlock] = {};
                for (int64_t d = 0; d < dim; ++d) {
                    v8d k[2];
                    std::memcpy(k, panel + d * 16, sizeof k);
                    for (int64_t i = 0; i < kRowBlock; ++i) {
                        lo[i] += qr[i * dim + d] * k[0];
                        hi[i] += qr[i * dim + d] * k[1];
                    }
                }
                for (int64_t i = 0; i < kRowBlock; ++i) {
                    std::memcpy(out + (r + i) * cols + j, &lo[i], sizeof lo[i]);
                    std::memcpy(out + (r + i) * cols + j + 8, &hi[i], sizeof hi[i]);
                }
            }
        }
    }
}

// out[r, c] += sum over keys [j0, j1) of w[r, j] m[j, c]; a block of keys at a time (its m rows stay in L2),
// the running sums kept in out between blocks: the same additions in the same order as one pass.
MLA_INLINE void weighted_rows_body(const double *w, int64_t rows, int64_t cols, const double *m, int64_t width,
                                   double *out) {
    for (int64_t j0 = 0; j0 < cols; j0 += kKeyBlock) {
        const int64_t j1 = std::min(cols, j0 + kKeyBlock);
        for (int64_t r = 0; r < rows; r += kRowBlock) {
            for (int64_t c = 0; c < width; c += 8) {
                v8d acc[kRowBlock];
                std::memcpy(acc, out + r * width + c, sizeof acc[0]);
                for (int64_t i = 1; i < kRowBlock; ++i) {
                    std::memcpy(&acc[i], out + (r + i) * width + c, sizeof acc[i]);
                }
                for (int64_t j = j0; j < j1; ++j) {
                    v8d mv;
                    std::memcpy(&mv, m + j * width + c, sizeof mv);
                    for (int64_t i = 0; i < kRowBlock; ++i) {
                        acc[i] += w[(r + i) * cols + j] * mv;
                    }
                }
                for (int64_t i = 0; i < kRowBlock; ++i) {
                    std::memcpy(out + (r + i) * width + c, &acc[i], sizeof acc[i]);
                }
            }
        }
    }
    for (int64_t e = 0; e < rows * width; ++e) {
        out[e] += 0.0;  // -0 -> +0: a row's zero terms past its own keys may only flip the sign of a zero
    }
}

using ScoresKernel = void (*)(const double *, int64_t, int64_t, const double *, int64_t, double *);
using WeightedKernel = void (*)(const double *, int64_t, int64_t, const double *, int64_t, double *);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) void row_scores_avx512(
    const double *q, int64_t rows, int64_t dim, const double *kp, int64_t cols, double *out) {
    row_scores_body(q, rows, dim, kp, cols, out);
}
__attribute__((target("avx2,fma"))) void row_scores_avx2(const double *q, int64_t rows, int64_t dim,
                                                          const double *kp, int64_t cols, double *out) {
    row_scores_body(q, rows, dim, kp, cols, out);
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) void weighted_rows_avx512(
    const double *w, int64_t rows, int64_t cols, const double *m, int64_t width, double *out) {
    weighted_rows_body(w, rows, cols, m, width, out);
}
__attribute__((target("avx2,fma"))) void weighted_rows_avx2(const double *w, int64_t rows, int64_t cols,
                                                             const double *m, int64_t width, double *out) {
    weighted_rows_body(w, rows, cols, m, width, out);
}
#endif
void row_scores_baseline(const double *q, int64_t rows, int64_t dim, const double *kp, int64_t cols, double *out) {
    row_scores_body(q, rows, dim, kp, cols, out);
}
void weighted_rows_baseline(const double *w, int64_t rows, int64_t cols, const double *m, int64_t width,
                            double *out) {
    weighted_rows_body(w, rows, cols, m, width, out);
}

ScoresKernel pick_scores_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (widest_isa()) {
    case Isa::avx512: return row_scores_avx512;
    case Isa::avx2: return row_scores_avx2;
    case Isa::baseline: break;
    }
#endif
    return row_scores_baseline;
}

WeightedKernel pick_weighted_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    switch (widest_isa()) {
    case Isa::avx512: return weighted_rows_avx512;
    case Isa::avx2: return weighted_rows_avx2;
    case Isa::baseline: break;
    }
#endif
    return weighted_rows_baseline;
}

const ScoresKernel row_scores_kernel = pick_scores_kernel();
const WeightedKernel weighted_rows_kernel = pick_weighted_kernel();

using Matrix = py::array_t<double, py::array::c_style>;

void check_blocks(int64_t rows, int64_t width, int64_t columns, const char *what) {
    if (rows % kRowBlock != 0 || width % columns != 0) {
        throw std::invalid_argument(std::string(what) + ": rows must be a multiple of 4 and the width of " +
                                    std::to_string(columns));
    }
}

// out [rows, cols] = q [rows, dim] @ K^T for K's first cols keys, K in panels kp [panels, dim, 16].
void row_scores(Matrix q, Matrix kp, py::array_t<double> out) {
    if (q.ndim() != 2 || kp.ndim() != 3 || out.ndim() != 2 || kp.shape(1) != q.shape(1) || kp.shape(2) != 16) {
        throw std::invalid_argument("row_scores: q [rows, dim], kp [panels, dim, 16], out [rows, cols]");
    }
    const int64_t rows = q.shape(0), dim = q.shape(1), cols = out.shape(1);
    if (out.shape(0) != rows || cols > 16 * kp.shape(0)) {
        throw std::invalid_argument("row_scores: out must be [rows, cols] with cols <= the panels' keys");
    }
    check_blocks(rows, cols, 16, "row_scores");
    double *o = writable(out, "out", rows, cols);
    py::gil_scoped_release release;
    row_scores_kernel(q.data(), rows, dim, kp.data(), cols, o);
}

// out [rows, width] = w [rows, cols] @ m [>= cols, width] (m's first cols rows).
void weighted_rows(Matrix w, Matrix m, py::array_t<double> out) {
    if (w.ndim() != 2 || m.ndim() != 2 || out.ndim() != 2) {
        throw std::invalid_argument("weighted_rows: w [rows, cols], m [keys, width], out [rows, width]");
    }
    const int64_t rows = w.shape(0), cols = w.shape(1), width = m.shape(1);
    if (m.shape(0) < cols || out.shape(0) != rows || out.shape(1) != width) {
        throw std::invalid_argument("weighted_rows: m needs at least w's columns as rows; out is [rows, width]");
    }
    check_blocks(rows, width, 8, "weighted_rows");
    double *o = writable(out, "out", rows, width);
    std::fill(o, o + rows * width, 0.0);
    py::gil_scoped_release release;
    weighted_rows_kernel(w.data(), rows, cols, m.data(), width, o);
}

// float64 -> bfloat16 bits, round to nearest even in one step (as ml_dtypes rounds, not through float32):
// add half an ulp of bf16 (minus one when the kept bit is even) and drop the low 45 of the 52
// mantissa bits; carries into the exponent are the round-ups across a binade.  Only where every value
// and its rounding are normal bf16 numbers (or zero): false otherwise, and the caller rounds instead.
bool round_to_bf16(py::array_t<double, py::array::c_style> values, py::array_t<uint16_t, py::array::c_style> out) {
    if (values.size() != out.size() || !out.writeable()) {
        throw std::invalid_argument("out must be a writable uint16 array of values' size");
    }
    const double *x = values.data();
    uint16_t *o = out.mutable_data();
    const py::ssize_t n = values.size();
    py::gil_scoped_release release;
    bool ok = true;
    for (py::ssize_t i = 0; i < n; ++i) {
        uint64_t bits;
        std::memcpy(&bits, &x[i], sizeof bits);
        const uint64_t rounded = bits + ((uint64_t{1} << 44) - 1) + ((bits >> 45) & 1);
        const int64_t exponent = static_cast<int64_t>((rounded >> 52) & 0x7FF) - 1023;
        const bool zero = (bits & 0x7FFFFFFFFFFFFFFFULL) == 0;
        ok &= zero || (exponent >= -126 && exponent <= 127);
        // sign, the 8-bit bf16 exponent (rebased from float64's 11 bits) and the 7 kept mantissa bits
        const uint64_t sign = (bits >> 48) & 0x8000;
        const uint64_t exp8 = zero ? 0 : static_cast<uint64_t>(exponent + 127) & 0xFF;
        o[i] = static_cast<uint16_t>(sign | (exp8 << 7) | ((rounded >> 45) & 0x7F));
    }
    return ok;
}

// e^x elementwise for x <= 0 (testing the kernel's exp against a correctly rounded one).
py::array_t<double> exp_nonpositive_array(py::array_t<double, py::array::c_style | py::array::forcecast> x) {
    py::array_t<double> out(x.size());
    const double *in = x.data();
    double *o = out.mutable_data();
    for (py::ssize_t i = 0; i < x.size(); ++i) {
        if (!(in[i] <= 0.0)) {
            throw std::invalid_argument("exp_nonpositive takes values <= 0 only");
        }
        o[i] = exp_nonpositive<double, int64_t>(in[i]);
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(_tile_kernel, m) {
    m.doc() = "Fused softmax passes of the golden generator's float64 attention tiles";
    m.def("softmax_tile", &softmax_tile, py::arg("scores"), py::arg("stats"), py::arg("causal_first"),
          py::arg("p32"), py::arg("p2_32"), py::arg("floor"), py::arg("raw") = py::none(), py::arg("ps") = py::none(),
          py::arg("ps_sums") = py::none(), py::arg("counts") = py::none(),
          "In place: scores -> e^(s - row max) on allowed keys (0 on masked ones); stats[4, rows] = max, "
          "min, sum P, sum P^2; optionally P and P^2 rounded up to float32 and floored at floor (0 on masked keys) "
          "and raw = the scores before, masked keys 0; optionally ps = (P / sum P) * raw and ps_sums[2, rows] = its "
          "row sums of |.| and of it.  counts[rows] (instead of causal_first): row r sees keys j < counts[r], "
          "and its ps sums run over those keys alone.");
    m.def("row_scores", &row_scores, py::arg("q"), py::arg("kp"), py::arg("out"),
          "out[r, j] = sum_d q[r, d] K[j, d], d ascending (K in panels kp[j / 16, d, j % 16]), for a row count a multiple of 4 and a width a multiple "
          "of 16 (the callers pad): each element in one fixed order, whatever the other rows.");
    m.def("weighted_rows", &weighted_rows, py::arg("w"), py::arg("m"), py::arg("out"),
          "out[r, c] = sum_j w[r, j] m[j, c], j ascending (zeros signless), for a row count a multiple of 4 and "
          "m's width a multiple of 8: each element in one fixed order, whatever the other rows.");
    m.def("baseline_softmax_tile", &baseline_softmax_tile, py::arg("scores"), py::arg("denom"), py::arg("scale"),
          py::arg("causal_first"), py::arg("dtype"),
          "In place: float32 scores -> P = e^(s scale - row max) rounded to dtype (fp16: subnormals flushed), 0 on "
          "masked keys; denom[rows] = float32 sums of the unrounded P.");
    m.def("finish_magnitudes", &finish_magnitudes, py::arg("abs_sum"), py::arg("sq_sum"), py::arg("psv"),
          py::arg("golden"), py::arg("denom"), py::arg("ps_sums"), py::arg("scale"), py::arg("cap"), py::arg("vmax"),
          py::arg("add"), py::arg("factor"), py::arg("gamma"), py::arg("pv_abs"), py::arg("pv_rss"), py::arg("pv_scale"),
          "pv_abs, pv_rss (lifted float32 sums) and pv_scale (guarded T) of one tile, rounded up to bf16 bits into "
          "the three [rows, 128] uint16 views, as magnitudes.fused_tile's numpy steps round them.");
    m.def("round_to_bf16", &round_to_bf16, py::arg("values"), py::arg("out"),
          "float64 -> bf16 bits (nearest even, one rounding) into out; False where a value leaves bf16's normal range.");
    m.def("exp_nonpositive", &exp_nonpositive_array, py::arg("x"), "The kernel's e^x for x <= 0.");
}
