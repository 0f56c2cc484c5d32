#!/usr/bin/env python3
"""Independent reference of the prefix-cache block hash (native/src/kv/block_hash.h), used to
derive the golden values in native/tests/test_prefix_cache.cpp. SipHash-2-4 written from the
paper (Aumasson & Bernstein 2012) and checked against the paper's own test vector first.
Run: python3 native/tests/reference/block_hash.py"""
import struct

MASK = (1 << 64) - 1


def rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & MASK


def siphash24(k0, k1, msg):
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rnd():
        v[0] = (v[0] + v[1]) & MASK; v[1] = rotl(v[1], 13) ^ v[0]; v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & MASK; v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & MASK; v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & MASK; v[1] = rotl(v[1], 17) ^ v[2]; v[2] = rotl(v[2], 32)

    n = len(msg)
    padded = msg + b"\0" * (7 - n % 8) + bytes([n & 0xFF])
    for i in range(0, len(padded), 8):
        m = struct.unpack("<Q", padded[i:i + 8])[0]
        v[3] ^= m
        rnd(); rnd()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        rnd()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def root(key, extra, scope):
    s = scope.encode()
    return siphash24(*key, b"sluice.root" + struct.pack("<QQ", extra, len(s)) + s)


def block(key, parent, tokens, extra):
    return siphash24(*key, struct.pack("<QQ", parent, len(tokens)) +
                     b"".join(struct.pack("<I", t & 0xFFFFFFFF) for t in tokens) + struct.pack("<Q", extra))


# The paper's vector: key 00..0f, message 00..0e.
k = struct.unpack("<QQ", bytes(range(16)))
assert siphash24(*k, bytes(range(15))) == 0xA129CA6149BE45E5

zero = (0, 0)
r = root(zero, 0, "")
h1 = block(zero, r, [1, 2, 3, 4], 0)
h2 = block(zero, h1, [1, 2, 3, 4], 0)
for name, value in [
    ("siphash24(key 00..0f, 00..0e)", siphash24(*k, bytes(range(15)))),
    ("root(0, 0, '')", r),
    ("h1", h1),
    ("h2", h2),
    ("root(key 00..0f, 0, '')", root(k, 0, "")),
    ("root(0, 0, 'org_a')", root(zero, 0, "org_a")),
    ("block(0, root, [1,2,3,4], 9)", block(zero, r, [1, 2, 3, 4], 9)),
    ("block(0, root, [-1], 0)", block(zero, r, [-1], 0)),
]:
    print(f"{name}: 0x{value:016x}")
