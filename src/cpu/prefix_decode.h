// The CPU decoder of prefix-coded streams (codec/prefix_code.h): several
// runs of one bit stream decoded four at a time, each lookup of the
// multi-symbol table writing every whole codeword of an 11-bit window. The
// form measured fastest by bench/experiments/prefix_decode_study.cpp
// (states in scalars, BMI2 shifts on x86-64; bench/experiments/notebook.md,
// "A prefix code for the exponent stream"). Not yet used by a block mode of
// the format: the building block of one, tested against the exact TZ_HD
// decoder.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tz::cpu {

// The decode tables of one code (built by prefix_build_single and
// prefix_build_multi with limit kPrefixMaxBits).
struct PrefixTables {
  const uint16_t* single;  // 2^kPrefixMaxBits entries
  const uint64_t* multi;   // 2^kPrefixMaxBits entries
};

// Decodes n_runs runs of in[0..size): run r is the bits [bit[r], bit[r + 1])
// holding count[r] symbols, written to out + first[r] (first[r] = the sum
// of count[0..r-1]: runs back to back). Returns 0 when every run took
// exactly its bits, 1 otherwise (then out holds unspecified bytes; nothing
// is read outside in[0..size) nor written outside the runs' output). bit[]
// has n_runs + 1 entries, non-decreasing, bit[n_runs] <= 8 * size.
int prefix_decode_runs(const uint8_t* in, size_t size, const uint64_t* bit, const uint32_t* count, uint32_t n_runs,
                       const PrefixTables& t, uint8_t* out);

}  // namespace tz::cpu
