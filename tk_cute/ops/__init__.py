"""Scoped ops (TK's vocabulary; the scope is in the module name):

- `tma` (one elected lane of a warp): TMA loads (multicast), stores, store waits;
- `warp` (32 lanes): lane identity, `elect_leader`, shuffles, the ``mma.sync`` m16n8k16 MMA;
- `warpgroup` (4 warps): wgmma MMAs (SS / RS, AB / ABt, mm / mma), fences, setmaxnreg,
  register <-> shared stores and loads, named-barrier `sync`;
- `register` (a register tile, whatever its scope): zero, copy, mul, add, row/col reductions;
- `nvfp4` (one thread): FP4 / UE4M3 encode and decode in registers;
- `ptx`: `asm`, the one inline-PTX helper every op above goes through;
- `memory` (one thread): global loads / stores with cache hints, predicated forms, shared
  vector loads / stores;
- Blackwell/Rubin: `tcgen05` (tensor-memory MMAs, scale copies), `cluster` (CTA pairs, PDL),
  `epilogue` (global scale, TMEM stores); shared by every GEMM: `schedule` (tile walk).
"""
