"""The model's per-layer prediction for the public gpt-oss-20b MI300X decode trace (docs/gpt-oss.md), written
before the trace's kernel durations were compared: vLLM's standard plan on the unvalidated mi300x profile, TP1,
batch 32, one token per sequence, 1,720 cached positions (the trace's step annotation: 55,086 key positions over
32 sequences, 1,721.4 each with the new token). Makespan = first kernel start to last kernel end, as
`moe-sim compare-trace` measures a layer.

    python docs/gpt_oss_prediction.py > docs/gpt-oss-prediction.csv
"""

from simulator.config import load_model
from simulator.cost.timeline import schedule
from simulator.hardware import load_hardware
from simulator.plans import standard
from simulator.plans.kernel import DecodeShape

cfg, hw = load_model("gpt-oss-20b"), load_hardware("mi300x")
shape = DecodeShape(32, 1, 1720)
print("layer,attention,kernels,makespan_us,attention_us,moe_us")
for layer in (12, 13):  # a sliding-window layer and a full-attention one
    tl = schedule(standard.build(cfg, 1, shape, "gqa", layer, arch=standard.arch_of(hw)), hw)
    start = min(s.start_us for s in tl.spans)
    moe_from = next(s.start_us for s in tl.spans if s.key == "router")
    attn_to = next(s.end_us for s in tl.spans if s.key == "post_attn_norm")
    kind = "sliding 128" if cfg.gqa_window(layer) else "full"
    span, attn, moe = tl.layer_us - start, attn_to - start, tl.layer_us - moe_from
    print(f"{layer},{kind},{len(tl.spans)},{span:.1f},{attn:.1f},{moe:.1f}")
