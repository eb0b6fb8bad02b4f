"""The GPT-2 program: the model in llm.c's parameter layout, llm.c's checkpoint and token-shard
formats, data preparation (data.py), training and sampling. `python -m project.gpt2` trains (main.py)."""
