"""Methods that judge a map or intervene on the model, running it many times or over many images: head ablation,
patching, faithfulness (deletion and insertion, ROAD), the sanity check, the scoreboard, evaluation over a set,
dataset runs under torchrun; and token norms. Tensor math over ``core`` and ``models``; nothing here draws or serves.
"""
