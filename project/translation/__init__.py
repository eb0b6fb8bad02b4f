"""The German->English translation program: corpus, tokenizer and batches; the model, its train
step and run; greedy and beam-search decoding, evaluation, parameter averaging; and translate.py,
which translates with a trained run. `python -m project.translation` trains (main.py)."""
