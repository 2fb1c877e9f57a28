"""Tensor parallelism across the devices of one host (`--tensor-parallel-size N`).

    sharding.py  which slice of each weight a rank holds (Megatron-style), as arithmetic
    group.py     the collectives the model calls (all-reduce, vocabulary-parallel lookup/gather)
    steps.py     rank 0's step plan, sent to the other ranks, and the loop they follow it in
    ranks.py     starting the rank processes, building each rank's engine, watching them

One process per rank; rank 0 is the `tidegate backend` process: it runs the worker, the engine
and the scheduler, and sends each step's chunks to the others before running the step. The
gateway sees one backend. See docs/tensor_parallel.md.
"""
