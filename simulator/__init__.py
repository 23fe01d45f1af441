"""moe-sim: a reference simulator of one Kimi K3-class MoE decode step under tensor parallelism.

Data flows config -> weights -> plan -> (executor | cost model) -> report, and nothing flows back.
"""

__version__ = "0.1.0"
