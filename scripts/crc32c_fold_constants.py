#!/usr/bin/env python3
"""Folding constants of the carry-less-multiply CRC32C (src/cpu/checksum_fold.cpp).

Derivation (reflected CRC32C, P(x) = 0x1EDC6F41 with the x^32 term):
a 16-byte block loaded little-endian as a 128-bit integer has bit i as the
coefficient of x^(127-i); the low 64-bit half H holds degrees 127..64, the high
half L degrees 63..0. Moving the block forward by D bits (so that the data
after it can be added) multiplies it by x^D:
    block * x^D = H * x^(64+D) + L * x^D  (mod P).
A 64x64 carry-less multiply of a reflected half by a constant c whose bit j is
the coefficient of x^(63-j) gives a product whose bit m is the coefficient of
x^(126-m): one degree short of the 128-bit block convention, so the constant
for "times x^E" is x^(E-1) mod P, stored as reflect32(x^(E-1) mod P) << 32.
Pairs (for H, for L) for a move of D bits: (x^(D+63), x^(D-1)) mod P.

Run it to print the C++ table; the test Crc32c.FoldConstantsFromPolynomial
recomputes them in C++ the same way.
"""

POLY = 0x11EDC6F41  # x^32 + ... CRC32C (Castagnoli), normal form


def xpow_mod(e: int) -> int:
    """x^e mod P as a normal-form integer (bit d = coefficient of x^d)."""
    r = 1
    for _ in range(e):
        r <<= 1
        if r & (1 << 32):
            r ^= POLY
    return r


def reflect32(v: int) -> int:
    return int(f"{v:032b}"[::-1], 2)


def const(e: int) -> int:
    return reflect32(xpow_mod(e - 1)) << 32


def pair(d_bits: int):
    return const(d_bits + 64), const(d_bits)


if __name__ == "__main__":
    for name, d in (("fold 256 bytes", 2048), ("fold 64 bytes", 512), ("fold 48 bytes", 384), ("fold 32 bytes", 256),
                    ("fold 16 bytes", 128)):
        hi, lo = pair(d)
        print(f"  {{0x{hi:016x}ull, 0x{lo:016x}ull}},  // {name}: x^{d + 63}, x^{d - 1} mod P")
