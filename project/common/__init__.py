"""What any training program needs, over minitorch's public face: option types (options), run
checkpoints (checkpoint), the save schedule and graceful stop (control), data parallelism
(parallel), the graph-replayed train step (train_step), the learning-rate schedule (schedule), the
validation loss (evaluation), the metrics log with its plots (metrics) and the --dtype context
(precision). It imports no program."""
