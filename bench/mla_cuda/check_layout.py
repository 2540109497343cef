#!/usr/bin/env python3
"""check_layout.py: host-side models of two pieces of index math in the MLA kernels (no GPU needed).

1. mla_prefill_cuda's tile loop (CTA = 128 queries, 64-key tiles, a warp skips tiles wholly after its rows,
   the causal mask only on diagonal tiles): every valid query row t sees exactly keys 0 .. q_pos0 + t, and
   no zero-filled key (>= n_end) is ever unmasked for a valid row.
2. mla_split_wgmma's shared-memory positions: where load_tile and the softmax's P writer put element (row, col)
   against where each wgmma descriptor of the kernel reads it, with the canonical 128-byte-swizzle layouts
   (K-major ((8,m),(T,2)):((8T,SBO),(1,T)), MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 16 bytes).
   This checks the kernel's offsets against that reading of the PTX layouts, not the hardware itself.
Mirrors the constants and expressions of src/ops/mla_prefill_cuda.cu and src/ops/mla_decode_wgmma_cuda.cu:
change them together.  Usage: python3 bench/mla_cuda/check_layout.py
"""
K_Q, K_KV = 128, 64
BLK = 64 * 128


def prefill_coverage(n_q, q_pos0):
    nblk = (n_q + K_Q - 1) // K_Q
    for bx in range(nblk):
        q0 = (nblk - 1 - bx) * K_Q
        n_end = q_pos0 + q0 + min(K_Q, n_q - q0)
        n_tiles = (n_end + K_KV - 1) // K_KV
        for warp in range(8):
            warp_max_pos = q_pos0 + q0 + warp * 16 + 15
            for g in range(8):
                pos_r0 = q_pos0 + q0 + warp * 16 + g
                for half in range(2):
                    t, pos = q0 + warp * 16 + g + 8 * half, pos_r0 + 8 * half
                    if t >= n_q:
                        continue
                    seen = set()
                    for it in range(n_tiles):
                        k0 = it * K_KV
                        if k0 > warp_max_pos:
                            continue
                        diag = k0 + K_KV - 1 > pos_r0 - g
                        seen |= {k for k in range(k0, k0 + K_KV) if not (diag and k > pos)}
                    assert max(seen) < n_end and seen == set(range(pos + 1)), (n_q, q_pos0, t)


def sw128(r, c):
    return r * 128 + ((c ^ (r & 7)) << 4)


def swizzle(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


def loader(r, col):  # load_tile: 16-byte chunk col / 8 -> block chunk / 8, sw128(r, chunk % 8)
    c = col // 8
    return (c // 8) * BLK + sw128(r, c % 8) + (col % 8) * 2


def k_major(start, m, k, sbo=1024):
    return swizzle(start + (m // 8) * sbo + (m % 8) * 128 + k * 2)


def mn_major(start, k, n, lbo, sbo):
    return swizzle(start + (n // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (n % 64) * 2)


def wgmma_layout():
    for kk in range(36):  # S = Q K^T: both K-major, k-step start (kk / 4) * BLK + (kk % 4) * 32
        st = (kk // 4) * BLK + (kk % 4) * 32
        assert all(k_major(st, m, k) == loader(m, kk * 16 + k) for m in range(64) for k in range(16))
    for wg in range(2):  # P V: V MN-major (LBO = BLK, SBO = 1024), start 4 wg BLK + kk 16 rows
        for kk in range(4):
            st = 4 * wg * BLK + kk * 16 * 128
            assert all(mn_major(st, k, n, BLK, 1024) == loader(kk * 16 + k, 256 * wg + n)
                       for k in range(16) for n in range(256))
    for kk in range(4):  # A = P (K-major), written at sw128(r, col / 8) + (col % 8) * 2
        assert all(k_major(kk * 32, m, k) == sw128(m, (kk * 16 + k) // 8) + ((kk * 16 + k) % 8) * 2
                   for m in range(64) for k in range(16))


if __name__ == "__main__":
    for n_q, p0 in [(1, 0), (17, 0), (130, 0), (300, 0), (17, 100), (200, 77), (64, 0), (129, 63), (1, 5000)]:
        prefill_coverage(n_q, p0)
    print("prefill tile loop: every valid row sees exactly its causal prefix")
    wgmma_layout()
    print("wgmma decode: loader / P writer positions = descriptor reads")
