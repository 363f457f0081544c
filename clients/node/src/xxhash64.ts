// XXH64 (seed 0) of a byte string, as keylane routes keys: the Go side
// uses github.com/cespare/xxhash/v2's Sum64. A straight port on BigInt:
// keys are at most 1 KiB, so its speed does not matter here, and it needs
// no native module. The conformance vectors (testdata/conformance/keys.json)
// decide that it agrees with the Go code.

const M64 = (1n << 64n) - 1n;
const P1 = 11400714785074694791n;
const P2 = 14029467366897019727n;
const P3 = 1609587929392839161n;
const P4 = 9650029242287828579n;
const P5 = 2870177450012600261n;

function rotl(x: bigint, r: bigint): bigint {
  return ((x << r) | (x >> (64n - r))) & M64;
}

function round(acc: bigint, input: bigint): bigint {
  acc = (acc + input * P2) & M64;
  acc = rotl(acc, 31n);
  return (acc * P1) & M64;
}

function mergeRound(acc: bigint, val: bigint): bigint {
  val = round(0n, val);
  acc ^= val;
  return (acc * P1 + P4) & M64;
}

function u64(b: Uint8Array, i: number): bigint {
  let lo = b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24);
  let hi = b[i + 4] | (b[i + 5] << 8) | (b[i + 6] << 16) | (b[i + 7] << 24);
  return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
}

function u32(b: Uint8Array, i: number): bigint {
  return BigInt((b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)) >>> 0);
}

/** xxhash64 returns XXH64 (seed 0) of b as an unsigned 64-bit BigInt. */
export function xxhash64(b: Uint8Array): bigint {
  const n = b.length;
  let i = 0;
  let h: bigint;
  if (n >= 32) {
    let v1 = (P1 + P2) & M64;
    let v2 = P2;
    let v3 = 0n;
    let v4 = (0n - P1) & M64;
    for (; i + 32 <= n; i += 32) {
      v1 = round(v1, u64(b, i));
      v2 = round(v2, u64(b, i + 8));
      v3 = round(v3, u64(b, i + 16));
      v4 = round(v4, u64(b, i + 24));
    }
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M64;
    h = mergeRound(h, v1);
    h = mergeRound(h, v2);
    h = mergeRound(h, v3);
    h = mergeRound(h, v4);
  } else {
    h = P5;
  }
  h = (h + BigInt(n)) & M64;
  for (; i + 8 <= n; i += 8) {
    h ^= round(0n, u64(b, i));
    h = (rotl(h, 27n) * P1 + P4) & M64;
  }
  if (i + 4 <= n) {
    h ^= (u32(b, i) * P1) & M64;
    h = (rotl(h, 23n) * P2 + P3) & M64;
    i += 4;
  }
  for (; i < n; i++) {
    h ^= (BigInt(b[i]) * P5) & M64;
    h = (rotl(h, 11n) * P1) & M64;
  }
  h ^= h >> 33n;
  h = (h * P2) & M64;
  h ^= h >> 29n;
  h = (h * P3) & M64;
  h ^= h >> 32n;
  return h;
}
