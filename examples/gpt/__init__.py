"""A small GPT trained with Transformer Engine modules under BF16 and every FP8/FP4 recipe
(the main job; run it with `python examples/gpt_demo.py` or `nox -s demo`)."""
