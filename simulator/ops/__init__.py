"""The math of one decoder layer, one file per op family: the reference form, the fused form with the same
contract, the entry points the kernels bind to, and the FLOP counts."""
