"""What any training program needs, over minitorch's public face: option types (options), run
checkpoints (checkpoint), the save schedule and graceful stop (control), data parallelism
(parallel), the graph-replayed train step (train_step), the learning-rate schedule (schedule), the
validation loss (evaluation) and the metrics log with its plots (metrics). It imports no program."""
