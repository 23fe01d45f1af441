"""The kernel plans, one per variant: `standard` (stock vLLM) and `specialized` (the fused path).

VARIANTS is the one tuple of variant names (kept import-light: the CLI's option choices read it);
`plans.builders.BUILDERS` maps each to its plan builder (the tiny dict of STYLE item 2).
"""

VARIANTS: tuple[str, ...] = ("standard", "specialized")
