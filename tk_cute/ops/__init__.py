"""Scoped ops: `tma` (one thread), `warpgroup` (wgmma, setmaxnreg, stores), `register`
(register-tile math and reductions)."""
