"""Methods that judge or intervene on the maps: head ablation, token norms, faithfulness (deletion and
insertion), the sanity check, comparison of two analyses, evaluation over a set, dataset runs under
torchrun. Pure tensor math over ``core`` and ``models``; nothing here draws or serves.
"""
