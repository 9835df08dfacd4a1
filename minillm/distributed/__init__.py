"""Tensor parallelism (chapter 13): one model's layers split across ranks that talk through torch.distributed.

    sharding.py       which slice of each weight a rank holds (column-, row- and vocabulary-parallel)
    shard_model.py    build a rank's shard of the model from the whole weights
    communicator.py   a rank's collectives (all-reduce, gather), counted and timed
    messages.py       what rank 0 and its workers tell each other over their pipes
    worker.py         a worker process: its shard of the model and of the KV cache
    executor.py       rank 0's side: start the workers, send each step, notice a lost one
"""
