// Element types shared by polykit's CUDA kernel families (no CUDA headers needed: NVRTC
// compiles this without an include path).
//
// half_t is fp16 *storage*; kernels load it as float (compute type) and round on store.
// ld() returns an element in its compute type, st() converts a compute value and stores it.
#pragma once

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct __align__(2) half_t { unsigned short x; };

__device__ __forceinline__ float h2f(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
  return f;
}
__device__ __forceinline__ half_t f2h(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
  return h;
}
__device__ __forceinline__ half_t d2h(double d) {
  half_t h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.x) : "d"(d));
  return h;
}

// bf16_t is bfloat16 *storage* (the top 16 bits of a float): loaded as float, rounded to
// nearest even on store (NaN stays a quiet NaN), like ml_dtypes' astype
struct __align__(2) bf16_t { unsigned short x; };

__device__ __forceinline__ float b2f(bf16_t b) { return __uint_as_float(((unsigned)b.x) << 16); }
__device__ __forceinline__ bf16_t f2b(float f) {
  const unsigned u = __float_as_uint(f);
  bf16_t b;
  b.x = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                         : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return b;
}

// compute type of a storage type: half/bfloat16 -> float, everything else itself
template <class T> struct Compute { typedef T type; };
template <> struct Compute<half_t> { typedef float type; };
template <> struct Compute<bf16_t> { typedef float type; };

template <class T> __device__ __forceinline__ typename Compute<T>::type ld(const T* p, i64 i) { return p[i]; }
template <> __device__ __forceinline__ float ld<half_t>(const half_t* p, i64 i) { return h2f(p[i]); }
template <> __device__ __forceinline__ float ld<bf16_t>(const bf16_t* p, i64 i) { return b2f(p[i]); }

// numeric limits used by reductions (lowest / highest finite or infinite value per type)
template <class T> struct Lim;
template <> struct Lim<float> { __device__ static float lo() { return -__int_as_float(0x7f800000); } __device__ static float hi() { return __int_as_float(0x7f800000); } };
template <> struct Lim<double> { __device__ static double lo() { return -__longlong_as_double(0x7ff0000000000000LL); } __device__ static double hi() { return __longlong_as_double(0x7ff0000000000000LL); } };
template <> struct Lim<i8> { __device__ static i8 lo() { return -128; } __device__ static i8 hi() { return 127; } };
template <> struct Lim<u8> { __device__ static u8 lo() { return 0; } __device__ static u8 hi() { return 255; } };
template <> struct Lim<i16> { __device__ static i16 lo() { return -32768; } __device__ static i16 hi() { return 32767; } };
template <> struct Lim<u16> { __device__ static u16 lo() { return 0; } __device__ static u16 hi() { return 65535; } };
template <> struct Lim<i32> { __device__ static i32 lo() { return (i32)0x80000000; } __device__ static i32 hi() { return 0x7fffffff; } };
template <> struct Lim<u32> { __device__ static u32 lo() { return 0; } __device__ static u32 hi() { return 0xffffffffu; } };
template <> struct Lim<i64> { __device__ static i64 lo() { return (i64)0x8000000000000000ULL; } __device__ static i64 hi() { return 0x7fffffffffffffffLL; } };
template <> struct Lim<u64> { __device__ static u64 lo() { return 0; } __device__ static u64 hi() { return 0xffffffffffffffffULL; } };
template <> struct Lim<bool> { __device__ static bool lo() { return false; } __device__ static bool hi() { return true; } };

template <class T> struct IsFloat { enum { value = 0 }; };
template <> struct IsFloat<float> { enum { value = 1 }; };
template <> struct IsFloat<double> { enum { value = 1 }; };
template <class T> struct IsInt { enum { value = 0 }; };
template <> struct IsInt<i8> { enum { value = 1 }; };
template <> struct IsInt<u8> { enum { value = 1 }; };
template <> struct IsInt<i16> { enum { value = 1 }; };
template <> struct IsInt<u16> { enum { value = 1 }; };
template <> struct IsInt<i32> { enum { value = 1 }; };
template <> struct IsInt<u32> { enum { value = 1 }; };
template <> struct IsInt<i64> { enum { value = 1 }; };
template <> struct IsInt<u64> { enum { value = 1 }; };

// cvt<To>(x): ONNX Cast semantics between compute types (x != 0 -> bool; integers wrap). A float
// becomes an integer by polykit's rule (reference cast.py): NaN -> 0, truncated toward zero,
// saturated to To's range -- what the GPU's cvt.rzi does, written out so that no C++ conversion
// sees a value outside To's range (undefined behaviour, and a different result on the host).
// (F)hi is hi, or the power of two above it, so x >= (F)hi holds exactly when trunc(x) >= hi
// or trunc(x) is past the range; lo is 0 or -2^k, exact in F.
template <class To, class From, bool F2I = IsFloat<From>::value && IsInt<To>::value> struct Cvt {
  __device__ static __forceinline__ To run(From x) { return (To)x; }
};
template <class To, class From> struct Cvt<To, From, true> {
  __device__ static __forceinline__ To run(From x) {
    if (x != x) return (To)0;
    if (x >= (From)Lim<To>::hi()) return Lim<To>::hi();
    if (x <= (From)Lim<To>::lo()) return Lim<To>::lo();
    return (To)x;
  }
};
template <class From> struct Cvt<bool, From, false> {
  __device__ static __forceinline__ bool run(From x) { return x != (From)0; }
};
template <class To> struct Cvt<To, bool, false> {
  __device__ static __forceinline__ To run(bool x) { return x ? (To)1 : (To)0; }
};
template <> struct Cvt<bool, bool, false> {
  __device__ static __forceinline__ bool run(bool x) { return x; }
};
template <class To, class From> __device__ __forceinline__ To cvt(From x) { return Cvt<To, From>::run(x); }

// st(p, i, v): store compute value v into storage type T
template <class T, class V> __device__ __forceinline__ void st(T* p, i64 i, V v) { p[i] = cvt<T>(v); }
template <class V> __device__ __forceinline__ void st(half_t* p, i64 i, V v) { p[i] = f2h(cvt<float>(v)); }
__device__ __forceinline__ void st(half_t* p, i64 i, double v) { p[i] = d2h(v); }
template <class V> __device__ __forceinline__ void st(bf16_t* p, i64 i, V v) { p[i] = f2b(cvt<float>(v)); }

// round_as<T>(x): compute value x rounded to storage type T and back (identity unless T is
// 16-bit): where a computation the spec writes in T rounds each stage
template <class T, class A> __device__ __forceinline__ A round_as(A x) { return x; }
template <> __device__ __forceinline__ float round_as<half_t, float>(float x) { return h2f(f2h(x)); }
template <> __device__ __forceinline__ float round_as<bf16_t, float>(float x) { return b2f(f2b(x)); }
// numpy's sum of a 16-bit array: float16 accumulates in float and rounds once, bfloat16
// (ml_dtypes) rounds every addition, in index order
template <class T> struct SumRoundsEachStep { static const bool value = false; };
template <> struct SumRoundsEachStep<bf16_t> { static const bool value = true; };

// offset of flat index `i` of a (collapsed) `rank`-D iteration space with sizes `dims`
// in a tensor with element `strides` (0 on broadcast dims); dims/strides innermost last.
template <int MAXR>
__device__ __forceinline__ i64 strided_offset(i64 i, int rank, const i64* dims, const i64* strides) {
  i64 off = 0;
#pragma unroll
  for (int d = MAXR - 1; d >= 0; --d) {
    if (d < rank) {
      i64 q = i / dims[d];
      off += (i - q * dims[d]) * strides[d];
      i = q;
    }
  }
  return off;
}
